"""Find, load and save models: uqc model artifacts and plain transformers directories alike."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uqcompress.artifacts import MANIFEST_NAME, SourceRef, open_artifact
from uqcompress.artifacts.hashing import directory_fingerprint
from uqcompress.artifacts.reader import read_manifest
from uqcompress.errors import ArtifactError, ConfigError
from uqcompress.models.families import Family, family_for_config
from uqcompress.models.kind_base import CALIBRATION_KEY, ModelKind
from uqcompress.models.kinds import PLAIN, kind_of
from uqcompress.models.precision import resolve_dtype, stored_dtype, torch_dtype
from uqcompress.models.preprocessing import ImagePreprocessing
from uqcompress.uq.calibration import Calibration

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

TRANSFORMERS_DIR = "transformers-dir"
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a verified model artifact or a transformers directory."""

    path: Path
    ref: SourceRef
    is_artifact: bool


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(spec: str) -> bool:
    """Whether a model spec that names nothing on disk is a Hugging Face Hub id (`org/name`)
    rather than a mistyped local path.

    A path: it starts with `.`, `~` or `/` (or is absolute), holds a backslash or two or more
    `/`, or its first part (`art` of `art/nope`) exists as a folder. A bare name without `/`
    (`modle`) is a path too: Hub ids are `org/name`, so a typo never goes to the network."""
    if spec.startswith((".", "~", "/")) or os.path.isabs(spec) or "\\" in spec:
        return False
    if spec.count("/") != 1 or not _HUB_ID.match(spec):
        return False
    return not os.path.isdir(spec.split("/", 1)[0])


def refuse_missing_path(spec: str) -> None:
    """One line for a local path that names nothing: never a Hub lookup, never a traceback."""
    parent = Path(spec).parent
    missing_parent = str(parent) not in ("", ".") and not parent.exists()
    tilde = " (uqc does not expand ~; the shell does, unquoted)" if spec.startswith("~") else ""
    raise ArtifactError(
        f"{spec} does not exist (no such directory"
        + (f"; nor does {parent}" if missing_parent else "")
        + f"){tilde}",
        hint="check the path; pass the directory a uqc step printed, a save_pretrained "
        "directory, or a Hub id as org/name",
    )


def resolve_model_source(
    path: Path | str, role: str = "model", trust_remote_code: bool = False
) -> ModelSource:
    """Accept a model artifact, a transformers `save_pretrained` directory (a lineage root),
    or a Hugging Face Hub id (`org/name`, downloaded when online)."""
    raw = str(path)
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        if not is_hub_id(raw):
            refuse_missing_path(raw)
        path = download_from_hub(raw)
    if (path / MANIFEST_NAME).is_file():
        artifact = open_artifact(path, expect_kind="model")
        return ModelSource(path=path, ref=SourceRef.of(role, artifact), is_artifact=True)
    if path.is_dir() and (path / "config.json").is_file():
        if not any((path / name).is_file() for name in _WEIGHT_FILES):
            raise ArtifactError(
                f"{path} has a config.json but no weights ({', '.join(_WEIGHT_FILES)})",
                hint="save the model with save_pretrained() so the weights are written",
            )
        _refuse_remote_code(path, trust_remote_code)
        fingerprint = directory_fingerprint(path)
        ref = SourceRef(
            role=role, path=path.resolve(), id=f"dir-{fingerprint}", kind=TRANSFORMERS_DIR
        )
        return ModelSource(path=path, ref=ref, is_artifact=False)
    read_manifest(path)  # raises the precise "does not exist / not an artifact" error
    raise ArtifactError(f"{path} is not a model", hint="pass a model artifact")  # unreachable


# config.json `architectures` of a transformers classifier: a folder naming none of these was
# saved without a classifier head (an encoder such as a sentence-embedding model)
CLASSIFIER_ARCHITECTURES = ("ForSequenceClassification", "ForImageClassification")


def head_never_trained(source: ModelSource) -> bool:
    """Whether the model's classifier head was never trained, read before any weight is:
    an artifact imported from a checkpoint without one (the import says so), or a
    transformers folder whose config.json names no classifier architecture."""
    import json

    if source.is_artifact:
        manifest = read_manifest(source.path)
        # Only an import records a head that was never trained; a finetune's flag says it
        # initialised one and then trained it.
        return manifest.step == "import" and bool(manifest.summary.get("classifier_initialised"))
    config = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
    names = config.get("architectures") or []
    return not any(str(name).endswith(CLASSIFIER_ARCHITECTURES) for name in names)


def download_from_hub(repo_id: str) -> Path:
    """Fetch config, tokenizer/processor files and safetensors weights of a Hub model."""
    hint = "pass a local save_pretrained() directory, or go online to download it"
    from uqcompress.runtime.planning import is_planning

    if is_planning():  # a dry run downloads nothing
        raise ArtifactError(
            f"{repo_id} is not a local path; a real run would download it from the Hugging "
            "Face Hub",
            hint="create the directory, or run without --dry-run",
        )
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ArtifactError(
            f"{repo_id} is not a local path, and as a Hugging Face Hub id it cannot be fetched: "
            "HF_HUB_OFFLINE is set",
            hint=hint,
        )
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]
        )
    except Exception as exc:  # network, auth, missing repo: all end the same way for a user
        raise ArtifactError(
            f"{repo_id} is not a local path, and downloading it from the Hugging Face Hub "
            f"failed ({first_line(exc)[:200]})",
            hint=hint,
        ) from exc
    return Path(local)


def _refuse_remote_code(path: Path, trust_remote_code: bool) -> None:
    """A checkpoint that ships its own Python (config `auto_map`) needs an explicit yes."""
    import json

    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(
            f"{path}/config.json is not valid JSON ({exc})",
            hint="re-save the model with save_pretrained()",
        ) from exc
    if isinstance(raw, dict) and raw.get("auto_map") and not trust_remote_code:
        raise ConfigError(
            f"{path} asks to run its own Python code (config.json has auto_map); refused",
            hint="if you trust its author, import it with uqc import DIR --trust-remote-code "
            "(uqc still loads it with transformers' own classes for its family)",
        )


def raw_config(directory: Path) -> dict[str, Any]:
    """A model directory's config.json as plain JSON, without transformers; {} when it is
    missing or unreadable (load_model reports that with its own message)."""
    import json

    try:
        raw = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def source_kind(source: ModelSource) -> ModelKind:
    """The kind of the model at `source` (models/kinds.py), from its config.json alone:
    without loading the weights, so steps can refuse before any work."""
    return kind_of(raw_config(source.path))


def refuse_fused(source: ModelSource, step: str) -> None:
    """Steps that read or rebuild one classifier (score, svd-ensemble, distill-director)
    cannot take an ensemble model."""
    kind = source_kind(source)
    if not kind.ensemble:
        return
    raise ConfigError(
        f"{source.path} is {kind.described}; {step} works on one classifier",
        hint=kind.refusal_hint(step),
    )


@dataclass
class LoadedModel:
    """A classifier ready to run, with everything needed to feed it data."""

    model: PreTrainedModel
    family: Family
    config: PretrainedConfig
    labels: list[str]
    tokenizer: PreTrainedTokenizerBase | None = None
    preprocessing: ImagePreprocessing | None = None
    new_head_keys: list[str] = field(default_factory=list)  # classifier weights initialised
    # `uqc calibrate`'s temperature and abstention rule, taken out of the config on load so
    # that a step deriving a new model from this one (finetune, prune, ...) never carries a
    # stale calibration forward; `save_model(keep_calibration=True)` writes it back.
    calibration: Calibration | None = None
    # What loading changed that a user should hear about (a checkpoint's half-precision
    # weights widened to float32, a padding token adopted): `uqc import` warns with these.
    notes: list[str] = field(default_factory=list)
    checkpoint_dtype: str | None = None  # the weights' dtype in the checkpoint, if not float32
    dtype: str = "float32"  # what the weights were loaded as and compute in (`--dtype`)

    def derived(self, model: Any, config: PretrainedConfig) -> LoadedModel:
        """Another model of the same task (an ensemble or student made from this one): same
        family, labels and input handling; no calibration, no new-head record."""
        return LoadedModel(
            model=model,
            family=self.family,
            config=config,
            labels=list(self.labels),
            tokenizer=self.tokenizer,
            preprocessing=self.preprocessing,
            dtype=self.dtype,
        )

    @property
    def input_kind(self) -> str:
        return self.family.input_kind

    @property
    def max_length(self) -> int | None:
        return self.family.max_length(self.config)

    def num_parameters(self) -> int:
        """Weights: parameters plus floating-point buffers (an SVE model's frozen singular
        vectors are buffers; integer buffers such as BERT's position ids are not weights)."""
        buffers = (b for b in self.model.buffers() if b.is_floating_point())
        return sum(p.numel() for p in self.model.parameters()) + sum(b.numel() for b in buffers)

    @property
    def members(self) -> int:
        """Predictions per input: M for an ensemble model (DIRECTOR: S samples), 1 for a
        classifier."""
        return kind_of(self.config).members(self.config)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torch.load(weights_only=True) opens with paragraphs of advice; the reason follows this.
_UNPICKLER = "WeightsUnpickler error:"


def first_line(exc: BaseException) -> str:
    """The first meaningful line of a library exception, for a one-line message (terminal
    colour codes dropped; for torch's weights-only load error, its reason, not its advice)."""
    text = _ANSI.sub("", str(exc))
    if _UNPICKLER in text:
        reason = text.split(_UNPICKLER, 1)[1].strip()
        lines = [line.strip() for line in reason.splitlines() if line.strip()]
        if lines:
            # its first sentence: "Unsupported global: GLOBAL x.Y was not an allowed global
            # by default", "Unsupported operand 103"
            return "torch refused to unpickle it: " + lines[0].split(". ")[0].rstrip(".")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def quiet_transformers() -> None:
    """No tqdm bars or info logs from transformers: our own progress goes to stderr."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def labels_of(config: PretrainedConfig) -> list[str]:
    id2label: dict[Any, str] = dict(config.id2label or {})
    count = int(config.num_labels or 0)
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(count)]


def has_default_labels(labels: list[str]) -> bool:
    """True when labels are transformers' placeholders LABEL_0..LABEL_{C-1} (no names given)."""
    return labels == [f"LABEL_{i}" for i in range(len(labels))]


def planned_dtype(source: ModelSource, requested: str) -> str:
    """The dtype `--dtype requested` loads `source` as (`auto` resolved from its config and
    size), read before loading so that it can go into the artifact id."""
    if requested != "auto":
        return requested
    from transformers import AutoConfig

    quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(str(source.path), trust_remote_code=False)
        family = family_for_config(config, str(source.path))
    except (ValueError, OSError, KeyError, ConfigError):
        return "float32"  # loading itself reports what is wrong with the checkpoint
    return resolve_dtype(requested, source.path, config, decoder=family.layout.causal)


def load_model(source: ModelSource, dtype: str = "float32") -> LoadedModel:
    """`_load`, timed for -v."""
    from uqcompress.runtime.console import phase, user

    with phase(f"load {user(source.path)}"):
        return _load(source, dtype)


def _load(source: ModelSource, dtype: str = "float32") -> LoadedModel:
    """Load the classifier, its labels and its tokenizer or image preprocessing (on CPU), its
    weights as `dtype` (`models.precision`: float32, bfloat16, float16 or auto)."""
    from transformers import AutoConfig

    quiet_transformers()
    path = source.path
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise ConfigError(
            f"{path}/config.json cannot be read by transformers ({first_line(exc)[:300]})",
            hint="pass a directory written by save_pretrained() of a supported family's model",
        ) from exc
    family = family_for_config(config, str(path))
    kind = kind_of(config)
    resolved = resolve_dtype(dtype, path, config, decoder=family.layout.causal)
    if kind.skeleton is not None:  # ours: transformers cannot rebuild its shapes
        return _finish(_load_into_skeleton(kind, path, config, family, resolved), path)
    stored = stored_dtype(config) or ""
    try:
        # float32 unless --dtype says otherwise, whatever the checkpoint holds: transformers 5
        # would keep the stored dtype by default, and half precision is a choice to make.
        model, info = _from_pretrained(family, path, stored, resolved)
    except Exception as exc:  # damaged weights, shapes that contradict config.json, ...
        raise ArtifactError(
            f"cannot load the model in {path}: {first_line(exc)[:300]}",
            hint="re-save it with save_pretrained(), or re-create the artifact",
        ) from exc
    model.eval()
    loaded = LoadedModel(
        model=model,
        family=family,
        config=model.config,
        labels=labels_of(model.config),
        dtype=resolved,
    )
    if stored and stored != "float32":
        loaded.checkpoint_dtype = stored
        if resolved != stored:
            loaded.notes.append(f"{path} stores {stored} weights; they were loaded as {resolved}")
    # A checkpoint without a classifier (an encoder such as a sentence-embedding model) gets
    # a randomly initialised head from transformers; say so instead of hiding it.
    head = family.classifier_name(model)
    loaded.new_head_keys = sorted(k for k in info.get("missing_keys", []) if k.startswith(head))
    return _finish(loaded, path)


def _from_pretrained(family: Family, path: Path, stored: str, resolved: str) -> tuple[Any, Any]:
    """The transformers model in `path` as `resolved`, and transformers' loading info.

    A checkpoint stored in another floating-point dtype is loaded as stored (its tensors are
    views into the mapped file) and cast one tensor at a time (`lean_load.cast_in_place`):
    transformers' own cast keeps every page of the file resident beside the cast weights
    until it returns (1.5x the float32 weights for a bfloat16 checkpoint). A checkpoint
    without some weights (a new classifier head) is loaded by transformers' cast instead,
    so the new weights are initialised in `resolved` as before.
    """
    from uqcompress.models.lean_load import cast_in_place

    cls = family.classifier_class()
    load = cls.from_pretrained
    # (a class that keeps some modules in float32 would lose that in the one-tensor cast)
    keeps_float32 = getattr(cls, "_keep_in_fp32_modules", None) or getattr(
        cls, "_keep_in_fp32_modules_strict", None
    )
    if stored and stored != resolved and not keeps_float32:
        import torch

        # the random number generators as transformers' cast would leave them: a fallback
        # initialises the new weights from the same state
        with torch.random.fork_rng(devices=[]):
            first: Any = load(str(path), output_loading_info=True, dtype=torch_dtype(stored))
        model, info = first
        if not info.get("missing_keys"):
            cast_in_place(model, torch_dtype(resolved), computed_buffers=False)
            model.config.dtype = torch_dtype(resolved)
            return model, info
        del model
    loaded: Any = load(str(path), output_loading_info=True, dtype=torch_dtype(resolved))
    return loaded[0], loaded[1]


def _finish(loaded: LoadedModel, path: Path) -> LoadedModel:
    """Attach the tokenizer or image preprocessing saved beside the weights, and take the
    calibration out of the config."""
    from transformers import AutoTokenizer

    family = loaded.family
    config = loaded.config
    raw = getattr(config, CALIBRATION_KEY, None)
    if raw is not None:
        try:
            loaded.calibration = Calibration.from_dict(raw)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(
                f"{path}/config.json has an unreadable {CALIBRATION_KEY} ({exc!r})",
                hint="re-create the model with uqc calibrate",
            ) from exc
        for each in {id(config): config, id(loaded.model.config): loaded.model.config}.values():
            if hasattr(each, CALIBRATION_KEY):
                delattr(each, CALIBRATION_KEY)
    if family.input_kind == "text":
        if not any((path / name).is_file() for name in _TOKENIZER_FILES):
            raise ArtifactError(
                f"{path} holds a text model but no tokenizer files ({', '.join(_TOKENIZER_FILES)})",
                hint="save the tokenizer beside the model (tokenizer.save_pretrained(dir))",
            )
        try:
            loaded.tokenizer = _saved_tokenizer_class(path, AutoTokenizer).from_pretrained(
                str(path)
            )
        except Exception as exc:  # transformers/tokenizers raise KeyError, Exception, ...
            _check_tokenizer_json(path)  # names the broken file, when one is
            present = [n for n in _TOKENIZER_FILES + _TOKENIZER_JSON if (path / n).is_file()]
            raise ArtifactError(
                f"the tokenizer in {path} ({', '.join(present)}) is broken or unreadable "
                f"({_one_line(exc)})",
                hint=_TOKENIZER_HINT,
            ) from exc
        settle_padding(loaded, path)
    else:
        loaded.preprocessing = ImagePreprocessing.load(
            path, int(config.image_size), int(config.num_channels)
        )
    return loaded


# The tokenizer's JSON files (besides tokenizer.json): each must be one JSON object.
_TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json")
_TOKENIZER_HINT = (
    "save the tokenizer again beside the model (tokenizer.save_pretrained(dir)), or copy "
    "its files from the checkpoint it came from"
)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}"[:200] if text else name


def _check_tokenizer_json(path: Path) -> None:
    """Name the tokenizer file that is broken, once loading the tokenizer failed (a large
    tokenizer.json is not parsed twice on every load): every tokenizer JSON file present must
    be one JSON object, and tokenizer.json must hold a tokenizer (a "model" and its
    "added_tokens"; `{}` made transformers fail with KeyError: 'added_tokens')."""
    import json

    for name in ("tokenizer.json", *_TOKENIZER_JSON):
        file = path / name
        if not file.is_file():
            continue
        try:
            value = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ArtifactError(
                f"the tokenizer file {file} is broken: not valid JSON ({_one_line(exc)})",
                hint=_TOKENIZER_HINT,
            ) from exc
        if not isinstance(value, dict):
            raise ArtifactError(
                f"the tokenizer file {file} is broken: it holds {type(value).__name__}, "
                "not a JSON object",
                hint=_TOKENIZER_HINT,
            )
        if name == "tokenizer.json":
            missing = [
                key
                for key, kind in (("model", dict), ("added_tokens", list))
                if not isinstance(value.get(key), kind)
            ]
            if missing:
                raise ArtifactError(
                    f"the tokenizer file {file} is broken: it has no "
                    f"{' or '.join(repr(k) for k in missing)} (not a saved tokenizers file)",
                    hint=_TOKENIZER_HINT,
                )


def _saved_tokenizer_class(path: Path, auto: Any) -> Any:
    """The class tokenizer_config.json names, when transformers has it, else AutoTokenizer.

    AutoTokenizer prefers the class registered for the model's type to the saved one for
    some types: a Qwen2 model saved with a WordPiece tokenizer (`uqc init`'s) came back as a
    Qwen2 BPE tokenizer that split every word into characters.
    """
    import json

    import transformers

    try:
        saved = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return auto
    name = saved.get("tokenizer_class") if isinstance(saved, dict) else None
    found = getattr(transformers, name, None) if isinstance(name, str) else None
    return found if isinstance(found, type) else auto


def settle_padding(loaded: LoadedModel, path: Path) -> None:
    """Give the model and its tokenizer one padding token, as transformers' own recipe for
    decoders does: the config's, else the tokenizer's, else the end-of-text token (a note
    says so). A last-token classifier without any cannot batch: one clear line."""
    config, tokenizer = loaded.model.config, loaded.tokenizer
    assert tokenizer is not None
    if config.pad_token_id is not None:
        return
    if tokenizer.pad_token_id is not None:
        config.pad_token_id = int(tokenizer.pad_token_id)
    elif tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
        config.pad_token_id = int(tokenizer.eos_token_id)
        loaded.notes.append(
            f"{path} has no padding token; the end-of-text token {tokenizer.eos_token!r} pads "
            "(transformers' recipe for decoders)"
        )
    elif loaded.family.layout.pooled_token == "last":
        raise ArtifactError(
            f"{path} has no padding token and no end-of-text token: its classifier reads the "
            "last real token, which cannot be found in a padded batch",
            hint="set pad_token_id in config.json and the tokenizer's pad_token",
        )
    loaded.config = config


def _load_into_skeleton(
    kind: ModelKind, path: Path, config: Any, family: Family, dtype: str = "float32"
) -> LoadedModel:
    """A model of one of our kinds (pruned, Hydra, SVE, DIRECTOR): its shapes come from the
    layout under the kind's key in the config; the weights are loaded strictly into that
    skeleton (plain transformers cannot: its shapes come from the config), as `dtype`."""
    import torch

    from uqcompress.models.lean_load import load_streamed

    assert kind.skeleton is not None
    # transformers builds modules in the config's dtype: the one they are held in, which is
    # also what the weights are saved as and what `--dtype auto` reads back
    config.dtype = torch_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]):  # loading must not move the global RNG
            model: Any = kind.skeleton(config, family)
        load_streamed(model, path / "model.safetensors")  # one tensor at a time
    except Exception as exc:  # missing file, wrong shapes, damaged data or spec
        raise ArtifactError(
            f"cannot load the {kind.noun} in {path}: {first_line(exc)[:300]}",
            hint=f"re-create it with {kind.remake}",
        ) from exc
    model.eval()
    model.to(torch_dtype(dtype))  # parts the skeleton built outside the config's dtype
    return LoadedModel(
        model=model, family=family, config=config, labels=labels_of(config), dtype=dtype
    )


def cast_loaded(loaded: LoadedModel, dtype: str) -> None:
    """Cast a loaded model's weights to `dtype` in place, its config saying so (what
    `save_model` writes and `--dtype auto` reads back)."""
    if loaded.dtype == dtype:
        return
    from uqcompress.models.lean_load import cast_in_place

    cast_in_place(loaded.model, torch_dtype(dtype))  # a mapped checkpoint's pages freed
    loaded.model.config.dtype = torch_dtype(dtype)
    loaded.dtype = dtype


def save_model(loaded: LoadedModel, directory: Path, keep_calibration: bool = False) -> None:
    """Write weights (safetensors), config, tokenizer or preprocessing into ``directory``.

    The result loads with plain `transformers.AutoModelFor...from_pretrained(directory)`.
    The calibration goes into config.json only with ``keep_calibration`` (`uqc calibrate`
    and the safetensors export): a model derived from a calibrated one is not calibrated.
    """
    quiet_transformers()
    config = loaded.model.config
    if keep_calibration and loaded.calibration is not None:
        setattr(config, CALIBRATION_KEY, loaded.calibration.to_dict())
        try:
            _save_weights_and_config(loaded, directory)
        finally:
            delattr(config, CALIBRATION_KEY)
    else:
        _save_weights_and_config(loaded, directory)
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(str(directory))
    if loaded.preprocessing is not None:
        loaded.preprocessing.save(directory)


def _save_weights_and_config(loaded: LoadedModel, directory: Path) -> None:
    config = loaded.model.config
    if kind_of(config) is not PLAIN:
        # One of our kinds (pruned, Hydra, SVE, DIRECTOR): transformers would rename keys to
        # its legacy layout on save and cannot rebuild our shapes on load, so weights go out
        # under the module's own names (safetensors, format=pt) and load back through
        # `_load_into_skeleton`.
        from safetensors.torch import save_model as save_safetensors_model

        directory.mkdir(parents=True, exist_ok=True)
        loaded.model.config.save_pretrained(str(directory))
        save_safetensors_model(
            loaded.model, str(directory / "model.safetensors"), metadata={"format": "pt"}
        )
    else:
        loaded.model.save_pretrained(str(directory), safe_serialization=True)


def calibration_dropped(loaded: LoadedModel, path: Path | str) -> str | None:
    """The warning for a step that derives a new model from a calibrated one: its temperature
    no longer fits the new model, so it is not carried over."""
    if loaded.calibration is None:
        return None
    return (
        f"{path} was calibrated (temperature {loaded.calibration.temperature:.4g}); the "
        "calibration is not carried over to this new model: run uqc calibrate on it"
    )
