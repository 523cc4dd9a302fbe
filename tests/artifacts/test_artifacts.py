"""Artifacts: deterministic ids, reuse, atomic writes, verification, lineage."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from uqcompress.artifacts import (
    ArtifactWriter,
    OutputPlan,
    clean_stale_temp_dirs,
    open_artifact,
    resolve_destination,
)
from uqcompress.artifacts.hashing import artifact_id
from uqcompress.artifacts.reader import safe_join
from uqcompress.errors import ArtifactError, IntegrityError, SchemaError


def _plan(value: int = 1) -> OutputPlan:
    return OutputPlan(kind="eval", step="eval", config={"x": value}, id_config={"x": value})


def _write(dest: Path, plan: OutputPlan, payload: str = "hello") -> Path:
    with ArtifactWriter(dest, plan) as writer:
        (writer.dir / "data.txt").write_text(payload)
        (writer.dir / "sub").mkdir()
        (writer.dir / "sub" / "more.txt").write_text("more")
        writer.summary["answer"] = 42
    return writer.artifact.path


def test_id_is_deterministic_and_content_based() -> None:
    a = artifact_id("model", 1, {"lr": 0.1}, ["in1"], ["fp1"])
    assert a == artifact_id("model", 1, {"lr": 0.1}, ["in1"], ["fp1"])
    assert a != artifact_id("model", 1, {"lr": 0.2}, ["in1"], ["fp1"])
    assert a != artifact_id("model", 1, {"lr": 0.1}, ["in2"], ["fp1"])
    assert a != artifact_id("model", 1, {"lr": 0.1}, ["in1"], ["fp2"])
    assert a != artifact_id("model", 2, {"lr": 0.1}, ["in1"], ["fp1"])


def test_written_artifact_records_hashes_and_verifies(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    artifact = open_artifact(path)
    assert set(artifact.manifest.files) == {"data.txt", "sub/more.txt"}
    assert artifact.manifest.files["data.txt"].bytes == 5
    assert artifact.manifest.summary == {"answer": 42}
    assert artifact.manifest.env["python"]
    raw = json.loads((path / "manifest.json").read_text())
    assert list(raw)[:2] == ["schema", "schema_version"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_failure_inside_writer_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "never"
    with pytest.raises(RuntimeError), ArtifactWriter(dest, _plan()) as writer:
        (writer.dir / "half.bin").write_bytes(b"x" * 100)
        raise RuntimeError("boom")
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []


def test_keyboard_interrupt_inside_writer_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "never"
    with pytest.raises(KeyboardInterrupt), ArtifactWriter(dest, _plan()):
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_same_id_is_reused_and_different_id_refused(tmp_path: Path) -> None:
    dest = tmp_path / "a"
    _write(dest, _plan(1))
    reused_dest, existing = resolve_destination(_plan(1), dest, force=False)
    assert existing is not None and existing.id == _plan(1).id and reused_dest == dest
    with pytest.raises(ArtifactError, match="already holds a different eval artifact") as info:
        resolve_destination(_plan(2), dest, force=False)
    assert info.value.hint is not None and "--force" in info.value.hint
    forced_dest, none = resolve_destination(_plan(2), dest, force=True)
    assert none is None
    _install = ArtifactWriter(forced_dest, _plan(2), force=True)
    with _install as writer:
        (writer.dir / "new.txt").write_text("new")
    assert open_artifact(dest).id == _plan(2).id
    assert not (dest / "data.txt").exists()


def test_replacing_other_artifacts_rebuilds_stale_ones_and_reuses_the_same(
    tmp_path: Path,
) -> None:
    """`uqc demo` owns what it wrote: a different artifact there is replaced, the same reused,
    a folder that is not an artifact is still refused, and so is an artifact the owner's
    predicate does not claim."""
    from uqcompress.artifacts.writer import replacing_other_artifacts

    dest = tmp_path / "a"
    _write(dest, _plan(1))
    theirs = _write(tmp_path / "theirs", _plan(7))
    with replacing_other_artifacts(lambda path: path.name != "theirs"):
        with pytest.raises(ArtifactError, match="already holds a different eval artifact"):
            resolve_destination(_plan(8), theirs, force=False)
        _, same = resolve_destination(_plan(1), dest, force=False)
        assert same is not None and same.id == _plan(1).id
        target, none = resolve_destination(_plan(2), dest, force=False)
        assert none is None
        with ArtifactWriter(target, _plan(2)) as writer:
            (writer.dir / "new.txt").write_text("new")
        precious = tmp_path / "precious"
        precious.mkdir()
        (precious / "thesis.txt").write_text("years of work")
        with pytest.raises(ArtifactError, match="already holds files that are not"):
            resolve_destination(_plan(3), precious, force=False)
    assert open_artifact(dest).id == _plan(2).id
    assert (precious / "thesis.txt").read_text() == "years of work"
    with pytest.raises(ArtifactError, match="already holds a different eval artifact"):
        resolve_destination(_plan(1), dest, force=False)  # outside the block: refused again


def test_default_location_is_kind_and_id_prefix(tmp_path: Path, _artifacts_root: Path) -> None:
    dest, existing = resolve_destination(_plan(3), None, force=False)
    assert existing is None
    assert dest == _artifacts_root / f"eval-{_plan(3).id[:8]}"


def test_tampered_and_truncated_files_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    (path / "data.txt").write_text("hellO")
    with pytest.raises(IntegrityError, match=r"data\.txt.*sha256"):
        open_artifact(path)
    (path / "data.txt").write_text("hel")
    with pytest.raises(IntegrityError, match=r"data\.txt.*3 bytes"):
        open_artifact(path)
    (path / "data.txt").unlink()
    with pytest.raises(IntegrityError, match=r"missing data\.txt"):
        open_artifact(path)


def _edit_manifest(path: Path, **changes: object) -> None:
    raw = json.loads((path / "manifest.json").read_text())
    raw.update(changes)
    (path / "manifest.json").write_text(json.dumps(raw))


def test_paths_leaving_the_directory_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    (tmp_path / "evil.txt").write_text("x")
    raw = json.loads((path / "manifest.json").read_text())
    raw["files"]["../evil.txt"] = {"sha256": "0" * 64, "bytes": 1}
    (path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IntegrityError, match="outside the artifact"):
        open_artifact(path)
    with pytest.raises(IntegrityError, match="absolute"):
        safe_join(path, "/etc/passwd")


def test_newer_kind_version_is_refused_with_upgrade_hint(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    _edit_manifest(path, kind_version=99)
    with pytest.raises(SchemaError, match="kind_version 99") as info:
        open_artifact(path)
    assert info.value.hint is not None and "upgrade" in info.value.hint


def test_unknown_kind_and_bad_json_are_schema_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    _edit_manifest(path, kind="mystery")
    with pytest.raises(SchemaError, match="mystery"):
        open_artifact(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(SchemaError, match="not valid JSON"):
        open_artifact(path)


def test_wrong_kind_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    with pytest.raises(ArtifactError, match=r"is an eval artifact; this step needs model"):
        open_artifact(path, expect_kind="model")


def test_stale_temp_dirs_of_dead_processes_are_cleaned(tmp_path: Path) -> None:
    from uqcompress.artifacts.writer import _host_tag

    host = _host_tag()
    dead = tmp_path / f".model-x.tmp-999999999-abcd-{host}"
    alive = tmp_path / f".model-y.tmp-{os.getpid()}-abcd-{host}"
    other_host = tmp_path / ".model-z.tmp-999999999-abcd-00000000"
    for folder in (dead, alive, other_host):
        folder.mkdir()
    removed = clean_stale_temp_dirs(tmp_path)
    assert removed == [dead]
    assert alive.exists() and other_host.exists() and not dead.exists()


def test_unlisted_files_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", _plan())
    (path / "added_tokens.json").write_text("{}")
    with pytest.raises(IntegrityError, match=r"added_tokens\.json .* not listed"):
        open_artifact(path)


def test_force_never_deletes_a_folder_that_is_not_an_artifact(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    with pytest.raises(ArtifactError, match="not a uqc artifact"):
        resolve_destination(_plan(), precious, force=True)
    assert (precious / "thesis.txt").read_text() == "years of work"


def test_lineage_cycles_are_reported_not_followed(tmp_path: Path) -> None:
    from uqcompress.artifacts.lineage import walk_lineage

    path = _write(tmp_path / "a", _plan())
    raw = json.loads((path / "manifest.json").read_text())
    raw["inputs"] = [{"role": "model", "path": ".", "id": raw["id"], "kind": "eval"}]
    (path / "manifest.json").write_text(json.dumps(raw))
    nodes = walk_lineage(path)
    assert [n.status for n in nodes] == ["ok", "cycle"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_file_of_an_artifact_gets_the_umask_mode(tmp_path: Path, umask: int) -> None:
    """safetensors wrote model.safetensors 0600 beside 0644 JSON: one mode, from the umask."""
    from uqcompress.models.factory import create_model
    from uqcompress.models.loading import save_model

    old = os.umask(umask)
    try:
        with ArtifactWriter(tmp_path / "m", _plan()) as writer:
            save_model(create_model("bert", ["neg", "pos"]), writer.dir)
            (writer.dir / "private.bin").write_bytes(b"x")
            (writer.dir / "private.bin").chmod(0o600)
        path = writer.artifact.path
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in path.rglob("*") if p.is_file()}
    assert "model.safetensors" in modes and "manifest.json" in modes
    assert set(modes.values()) == {0o666 & ~umask}, modes
    assert path.stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("code", [28, 30, 27])  # ENOSPC, EROFS, EFBIG
def test_environment_faults_while_writing_an_artifact_are_one_line(  # type: ignore[no-untyped-def]
    cli, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path], tmp_path: Path, monkeypatch, code
) -> None:
    """Issue 26 item 23: the fault raised where the artifact writer installs its manifest
    gives one line (what, and the fix) and leaves no temp folder; an existing artifact stays."""
    real_replace = os.replace

    def failing_replace(src, dst) -> None:  # type: ignore[no-untyped-def]
        if Path(dst).name == "manifest.json":
            raise OSError(code, os.strerror(code), str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    out = tmp_path / "out" / "eval"
    result = cli("eval", tiny_bert_artifact, "--data", sentiment_csv["test"], "--out", out)
    assert result.code == 1 and result.out == "", result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and os.strerror(code) in lines[0] and "(fix: " in lines[0]
    assert list((tmp_path / "out").iterdir()) == []


def test_sibling_temp_names_fit_in_255_bytes() -> None:
    from uqcompress.artifacts.writer import sibling_temp_name

    name = "é" * 125  # 250 bytes
    temp = sibling_temp_name(name, ".tmp-12345-abcdef01-12345678")
    assert len(temp.encode()) <= 255 and temp.endswith(".tmp-12345-abcdef01-12345678")
    assert sibling_temp_name("short", ".old-1") == ".short.old-1"
