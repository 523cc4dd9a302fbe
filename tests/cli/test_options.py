"""Options that used to be accepted and fail later or silently (issue 14, items 8-10):
`init --set` typos, non-finite floats, absurd `--threads`. Plus the bad-input rows of items
6-10, checked the way tests/cli/test_bad_input_matrix.py checks its rows."""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from uqcompress.errors import ConfigError

# --- item 8: `init --set` keys ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "key", "closest"),
    [("bert", "num_hidden_layer", "num_hidden_layers"), ("vit", "patchsize", "patch_size")],
)
def test_unknown_set_key_is_refused_naming_the_closest_keys(
    family: str, key: str, closest: str
) -> None:
    from uqcompress.models.factory import create_model

    with pytest.raises(ConfigError, match=f"--set {key}: unknown {family} config key") as caught:
        create_model(family, ["a", "b"], overrides={key: 1})
    assert caught.value.hint is not None and caught.value.hint.startswith(
        f"did you mean {closest}?"
    )


def test_unknown_set_key_without_a_close_match_lists_the_known_keys() -> None:
    from uqcompress.models.factory import create_model

    with pytest.raises(ConfigError) as caught:
        create_model("bert", ["a", "b"], overrides={"zzzz": 1})
    assert caught.value.hint is not None and "num_hidden_layers" in caught.value.hint


def test_init_step_refuses_before_writing_and_never_reuses(tmp_path: Path) -> None:
    from uqcompress.steps import init

    cfg = init.InitConfig(family="bert", labels=["a", "b"], overrides={"num_hidden_layer": 1})
    with pytest.raises(ConfigError, match="num_hidden_layer"):
        init.run(cfg, tmp_path / "typo")
    assert list(tmp_path.iterdir()) == []


def test_known_set_keys_still_work() -> None:
    from uqcompress.models.factory import create_model

    loaded = create_model(
        "bert", ["a", "b"], overrides={"num_hidden_layers": 1, "hidden_dropout_prob": 0.2}
    )
    assert loaded.config.num_hidden_layers == 1 and loaded.config.hidden_dropout_prob == 0.2
    vit = create_model("vit", ["a", "b"], overrides={"head_dim": 4})  # ViT's attention reads it
    model: Any = vit.model
    assert model.vit.layers[0].attention.head_dim == 4


@pytest.mark.parametrize(("key", "flag"), [("id2label", "--labels"), ("num_labels", "--labels")])
def test_label_keys_point_to_the_label_flags(key: str, flag: str) -> None:
    from uqcompress.models.factory import create_model

    with pytest.raises(ConfigError, match=f"--set {key}") as caught:
        create_model("bert", ["a", "b"], overrides={key: 3})
    assert caught.value.hint is not None and flag in caught.value.hint


def test_non_finite_set_value_is_refused() -> None:
    from uqcompress.models.factory import create_model

    with pytest.raises(ConfigError, match="hidden_dropout_prob=nan is not a finite number"):
        create_model("bert", ["a", "b"], overrides={"hidden_dropout_prob": math.nan})


# --- item 9: every float option refuses NaN and infinities -----------------------------------


def _scalar(hint: Any) -> Any:
    """The scalar type of an option's hint, Optional and list stripped."""
    origin = typing.get_origin(hint)
    if origin is list:
        return _scalar(typing.get_args(hint)[0])
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return _scalar(args[0]) if args and origin is not None else hint


def _float_options() -> list[tuple[str, str]]:
    """(command, --flag) for every float option of every `uqc` command."""
    import typer

    from uqcompress.cli.app import app

    group = typer.main.get_command(app)
    found = []
    for info in app.registered_commands:
        assert info.name is not None and info.callback is not None
        hints = typing.get_type_hints(info.callback)
        command = group.commands[info.name]  # type: ignore[attr-defined]
        for param in command.params:
            if _scalar(hints.get(param.name)) is float:
                found.append((info.name, next(o for o in param.opts if o.startswith("--"))))
    return found


FLOAT_OPTIONS = _float_options()


def test_the_float_options_are_found() -> None:
    assert ("svd-ensemble", "--sigma-init") in FLOAT_OPTIONS
    assert ("finetune", "--lr") in FLOAT_OPTIONS
    assert len(FLOAT_OPTIONS) >= 10


def _required_args(name: str) -> list[str]:
    """Placeholder values for a command's required arguments and options: the finite-number
    check runs before the command body reads any of them."""
    import typer

    from uqcompress.cli.app import app

    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    args: list[str] = []
    for param in command.params:
        if param.required:
            flag = [o for o in param.opts if o.startswith("-")]
            args += [*flag[:1], "1"]
    return args


@pytest.mark.parametrize(
    ("command", "flag"), FLOAT_OPTIONS, ids=[" ".join(f) for f in FLOAT_OPTIONS]
)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_option_refuses_non_finite_numbers(
    cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    command: str,
    flag: str,
    value: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli(command, *_required_args(command), flag, value)
    assert result.code == 1, result.err
    assert result.out == ""
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert f"error: {flag} {float(value)} is not a finite number" in lines[0]
    assert "(fix: " in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_non_finite_number_in_a_recipe_is_refused_naming_the_option(
    cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '# sve with an impossible sigma\n[vars]\n[steps.sve]\nrun = "svd-ensemble"\n'
        f'model = "{tiny_bert_artifact}"\ndata = "{sentiment_csv["train"]}"\nsigma_init = inf\n',
        encoding="utf-8",
    )
    result = cli("run", str(recipe))
    assert result.code == 1
    # Refused by the recipe check, before any step runs, by key path.
    assert "steps.sve.sigma_init: expected a finite number, got inf" in result.err


def test_finite_floats_pass_through_unchanged(
    cli,
    tiny_bert_artifact: Path,  # type: ignore[no-untyped-def]
    sentiment_csv: dict[str, Path],
) -> None:
    result = cli(
        "calibrate",
        str(tiny_bert_artifact),
        "--data",
        str(sentiment_csv["test"]),
        "--abstain-coverage",
        "0.9",
        "--json",
    )
    assert result.code == 0, result.err


# --- item 10: --threads is bounded -----------------------------------------------------------


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 2-core machine (limit 8 threads); torch's thread count is restored afterwards."""
    import torch

    from uqcompress.runtime import device

    monkeypatch.setattr(device, "usable_cores", lambda: 2)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_threads_above_four_times_the_cores_are_refused(two_cores: None) -> None:
    from uqcompress.runtime.device import configure_threads

    assert configure_threads(8) == 8  # 4 x 2 cores is the limit, and allowed
    with pytest.raises(ConfigError, match=r"--threads 9 is more than 8 \(4 x the 2 CPU cores"):
        configure_threads(9)
    with pytest.raises(ConfigError, match="--threads 100000 is more than 8"):
        configure_threads(100_000)


def test_uqc_threads_above_the_limit_names_the_variable(
    two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uqcompress.runtime.device import configure_threads

    monkeypatch.setenv("UQC_THREADS", "100000")
    with pytest.raises(ConfigError, match="UQC_THREADS=100000 is more than 8"):
        configure_threads(None)


def test_usable_cores_is_positive() -> None:
    from uqcompress.runtime.device import max_threads, usable_cores

    assert usable_cores() >= 1 and max_threads() == 4 * usable_cores()
