"""Write an artifact atomically: build in a sibling temp dir, manifest last, rename into place.

A crash, Ctrl-C or SIGTERM never leaves a directory that looks complete: until the rename,
the output lives in ``.<name>.tmp-<pid>-<random>`` beside the destination and is removed on
any exception. Existing artifacts are never edited; replacing one needs ``force``.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import socket
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from uqcompress import __version__
from uqcompress.artifacts.hashing import artifact_id, sha256_file
from uqcompress.artifacts.kinds import KIND_VERSIONS
from uqcompress.artifacts.manifest import MANIFEST_NAME, SCHEMA, FileEntry, InputRef, Manifest
from uqcompress.artifacts.reader import (
    Artifact,
    load_manifest_json,
    open_artifact,
    read_manifest,
    walk_entries,
)
from uqcompress.errors import ArtifactError, UqcError
from uqcompress.runtime import interrupts

TMP_MARKER = ".tmp-"


def _host_tag() -> str:
    """Short hash of this host's name: temp dirs of other hosts sharing the folder are kept."""
    import hashlib

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


NAME_MAX = 255  # bytes per path part on every common file system


def sibling_temp_name(name: str, suffix: str) -> str:
    """`.<name><suffix>` for a temp file or folder beside `name`, cut to NAME_MAX bytes: a
    valid 250-byte --out must not fail because its temp name is longer. Only the copy of
    `name` is shortened (whole characters), so the suffix (pid, random part) stays parseable."""
    keep = name
    while len(f".{keep}{suffix}".encode()) > NAME_MAX and keep:
        keep = keep[:-1]
    return f".{keep}{suffix}"


_ROOT: ContextVar[Path | None] = ContextVar("uqc_artifacts_root", default=None)


def default_root() -> Path:
    """Where artifacts go without ``--out``: the root `artifacts_root` set (``uqc run
    --artifacts``), else ``$UQC_ARTIFACTS`` or ``./artifacts``."""
    root = _ROOT.get()
    return root if root is not None else Path(os.environ.get("UQC_ARTIFACTS", "artifacts"))


@contextmanager
def artifacts_root(root: Path | None) -> Iterator[None]:
    """Within this block, artifacts without ``--out`` go under `root` (None: no change)."""
    token = _ROOT.set(Path(root) if root is not None else _ROOT.get())
    try:
        yield
    finally:
        _ROOT.reset(token)


_REPLACEABLE: ContextVar[Callable[[Path], bool] | None] = ContextVar(
    "uqc_replaceable_artifacts", default=None
)


@contextmanager
def replacing_other_artifacts(may_replace: Callable[[Path], bool]) -> Iterator[None]:
    """Within this block, a destination that holds a different (or damaged) uqc artifact is
    replaced as `--force` would replace it when ``may_replace(dest)`` says so, while one
    with the same id is still reused.

    For a command that owns what it wrote in its output folder (`uqc demo`): re-run after
    an upgrade that changed a step's defaults, it rebuilds what changed instead of stopping
    at the first stale artifact, and `may_replace` keeps it to the artifacts it wrote itself
    (a user's artifact at the same path is refused). Anything that is not a uqc artifact
    holding only its own files is always refused."""
    token = _REPLACEABLE.set(may_replace)
    try:
        yield
    finally:
        _REPLACEABLE.reset(token)


def _may_replace(dest: Path) -> bool:
    """Whether `replacing_other_artifacts` lets an artifact at ``dest`` be replaced."""
    may_replace = _REPLACEABLE.get()
    return may_replace is not None and dest.is_dir() and may_replace(dest)


@dataclass(frozen=True)
class SourceRef:
    """An input as a step sees it: an absolute location plus the identity it had when read."""

    role: str
    path: Path
    id: str
    kind: str
    manifest_sha256: str | None = None

    @classmethod
    def of(cls, role: str, artifact: Artifact) -> SourceRef:
        return cls(
            role=role,
            path=artifact.path.resolve(),
            id=artifact.id,
            kind=artifact.kind,
            manifest_sha256=sha256_file(artifact.path / MANIFEST_NAME),
        )


@dataclass
class OutputPlan:
    """Everything that determines an artifact's identity, known before any work is done."""

    kind: str
    step: str
    config: dict[str, Any]
    id_config: dict[str, Any]
    inputs: list[SourceRef] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    device: str = "cpu"

    @property
    def kind_version(self) -> int:
        return KIND_VERSIONS[self.kind]

    @property
    def id(self) -> str:
        return artifact_id(
            self.kind,
            self.kind_version,
            {"step": self.step, **self.id_config},
            [ref.id for ref in self.inputs],
            [str(item["fingerprint"]) for item in self.data],
        )


def destination_path(plan: OutputPlan, out: Path | None) -> Path:
    """Where a step writes: ``out``, or ``<default root>/<kind>-<id8>``."""
    return Path(out) if out is not None else default_root() / f"{plan.kind}-{plan.id[:8]}"


def local_data_paths(data: list[dict[str, Any]]) -> list[Path]:
    """The local files and folders among a plan's data specs (`builtin:` and `hf:` are not)."""
    paths = []
    for item in data:
        spec = item.get("spec")
        if isinstance(spec, str) and spec and not spec.startswith(("builtin:", "hf:")):
            paths.append(Path(spec))
    return paths


def refuse_output_over_inputs(dest: Path, what: str, inputs: list[Path]) -> None:
    """Raise if the output `dest` is one of the command's inputs (model, data file, data or
    image folder), lies inside one, or contains one: compared as real paths (symlinks
    resolved, hard links by inode), so `--out t.csv --force` can never overwrite `--data t.csv`."""
    target = Path(os.path.realpath(dest))
    for given in inputs:
        source = Path(os.path.realpath(given))
        same = target == source
        if not same and target.exists() and source.exists():
            try:
                same = os.path.samefile(target, source)
            except OSError:
                same = False
        if same or source in target.parents or target in source.parents:
            raise ArtifactError(
                f"{what} overlaps the input {given}; a command never writes over its inputs",
                hint="choose an --out that is not an input (model, --data or another input file)",
            )


def uqc_manifest_json(path: Path) -> dict[str, Any] | None:
    """The parsed JSON of ``path`` if it is a regular file holding a uqcompress manifest
    (schema tag), however damaged the rest of it is; else None."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        raw = load_manifest_json(path)
    except UqcError:
        return None
    return raw if isinstance(raw, dict) and raw.get("schema") == SCHEMA else None


def is_uqc_manifest(path: Path) -> bool:
    """Whether ``path`` is a regular file holding a uqcompress manifest."""
    return uqc_manifest_json(path) is not None


def refuse_unless_replaceable(dest: Path) -> None:
    """Raise unless ``--force`` may delete ``dest``: an empty folder, or a uqc artifact that
    holds nothing but the files its manifest lists (it may be damaged: files missing or
    changed). Anything else may be a user's own files, and --force never deletes those."""
    entries = walk_entries(dest)
    if not entries:
        return
    refusal = ArtifactError(
        f"--out {dest} holds files that are not a uqc artifact; --force only replaces artifacts",
        hint="choose another --out, or move those files away yourself",
    )
    manifest_path = dest / MANIFEST_NAME
    raw = uqc_manifest_json(manifest_path)
    if raw is None:
        raise refusal
    files = raw.get("files")
    listed = set(files) if isinstance(files, dict) else set()
    # A folder is the artifact's own when it leads to a listed file.
    folders = {"/".join(rel.split("/")[:i]) for rel in listed for i in range(1, rel.count("/") + 1)}
    for rel, info in entries:
        own = (
            rel in folders
            if stat.S_ISDIR(info.st_mode)
            else stat.S_ISREG(info.st_mode) and (rel == MANIFEST_NAME or rel in listed)
        )
        if not own:
            raise ArtifactError(
                f"--out {dest} holds {rel}, which its manifest does not list; --force only "
                "replaces a uqc artifact that holds nothing but its own files",
                hint="choose another --out, or move that file away yourself",
            )


def stale_input(existing: Manifest, plan: OutputPlan) -> str | None:
    """The role and path of an input that changed since ``existing`` was made from it, if any.

    The id of an artifact covers its inputs' ids, not their bytes: an input rebuilt with
    ``--force`` or edited and resealed keeps its id, so an artifact made from the old one
    would be reused with stale numbers. The recorded manifest sha256 tells them apart.
    """
    recorded = {ref.id: ref.manifest_sha256 for ref in existing.inputs if ref.manifest_sha256}
    for ref in plan.inputs:
        before = recorded.get(ref.id)
        if before is not None and ref.manifest_sha256 is not None and before != ref.manifest_sha256:
            return f"{ref.role} {ref.path}"
    return None


def resolve_destination(
    plan: OutputPlan, out: Path | None, force: bool
) -> tuple[Path, Artifact | None]:
    """Pick the output directory; return the existing artifact there if it can be reused.

    Same id at the destination: reuse (the caller skips the work), unless it was made from
    an input that has been replaced since: then it is rebuilt. Anything else there: refuse,
    unless ``force`` and it is an artifact holding only its own files (or empty).
    """
    dest = destination_path(plan, out)
    if dest.is_symlink():
        # renaming onto a link would replace the link, not what it points to: be explicit
        raise ArtifactError(
            f"--out {dest} is a symlink", hint="pass the folder it points to, or another --out"
        )
    if not dest.exists():
        return dest, None
    if not dest.is_dir():
        raise ArtifactError(
            f"--out {dest} is a file, not a folder", hint="choose a directory path for --out"
        )
    if force:
        refuse_unless_replaceable(dest)
        return dest, None
    try:
        existing = read_manifest(dest)
    except UqcError:
        existing = None
    if existing is not None and existing.id == plan.id and existing.kind == plan.kind:
        if stale_input(existing, plan) is None:
            try:
                return dest, open_artifact(dest)
            except UqcError:
                pass  # damaged: fall through to the refusal below, which names --force
        else:
            # Made from an input that was replaced since: its numbers are stale, and the
            # artifact is ours (same id), so it is rebuilt rather than reused.
            refuse_unless_replaceable(dest)
            return dest, None
    if existing is None and not any(dest.iterdir()):
        return dest, None  # an empty directory holds nothing to lose
    if existing is not None and _may_replace(dest):
        refuse_unless_replaceable(dest)
        return dest, None
    if existing is None:
        what = "files that are not this artifact"
    elif existing.id == plan.id and existing.kind == plan.kind:
        what = f"this {existing.kind} artifact, damaged (it fails verification)"
    else:
        what = f"a different {existing.kind} artifact (id {existing.id[:8]})"
    raise ArtifactError(
        f"--out {dest} already holds {what}",
        hint="choose another --out, or pass --force to replace it",
    )


def _env(device: str) -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    ort = version("onnxruntime") or version("onnxruntime-gpu")
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "onnxruntime": ort,
        "device": device,
    }


class ArtifactWriter:
    """Context manager that owns a temp dir and turns it into the artifact on success.

    Usage::

        with ArtifactWriter(dest, plan) as writer:
            (writer.dir / "metrics.json").write_text(...)
            writer.summary["acc"] = 0.97
        artifact = writer.artifact
    """

    def __init__(
        self, dest: Path, plan: OutputPlan, force: bool = False, discard: bool = False
    ) -> None:
        self.dest = Path(dest)
        self.plan = plan
        # Within `replacing_other_artifacts`, an artifact it may replace at dest is replaced.
        self.force = force or _may_replace(self.dest)
        # discard: compute everything, install nothing (non-zero ranks of a multi-process run)
        self.discard = discard
        self.summary: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.extra_config: dict[str, Any] = {}
        self._artifact: Artifact | None = None
        parent = self.dest.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(
                f"cannot create the output folder {parent}: {exc.strerror or exc}",
                hint="choose an --out in a writable directory",
            ) from exc
        self.dir = parent / sibling_temp_name(
            self.dest.name, f"{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}-{_host_tag()}"
        )

    def __enter__(self) -> ArtifactWriter:
        try:
            self.dir.mkdir()
        except OSError as exc:
            raise ArtifactError(
                f"cannot write in {self.dir.parent}: {exc.strerror or exc}",
                hint="choose an --out in a writable directory",
            ) from exc
        return self

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    @property
    def artifact(self) -> Artifact:
        if self._artifact is None:
            raise RuntimeError("the artifact is only available after the with-block succeeds")
        return self._artifact

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None or self.discard:
            shutil.rmtree(self.dir, ignore_errors=True)
            if exc_type is None:
                self._artifact = Artifact(path=self.dest, manifest=self._manifest())
            return
        try:
            self._finalise()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _finalise(self) -> None:
        apply_umask_modes(self.dir)
        manifest = self._manifest()
        # The manifest is written last: its presence is what makes the directory an artifact.
        tmp_manifest = self.dir / (MANIFEST_NAME + ".partial")
        tmp_manifest.write_text(manifest.to_json(), encoding="utf-8")
        os.replace(tmp_manifest, self.dir / MANIFEST_NAME)
        # A Ctrl-C whose KeyboardInterrupt was lost (raised in a __del__, swallowed by a
        # library) must still leave nothing behind.
        interrupts.check()
        self._install()
        self._artifact = Artifact(path=self.dest, manifest=manifest)

    def _manifest(self) -> Manifest:
        files: dict[str, FileEntry] = {}
        for path in sorted(p for p in self.dir.rglob("*") if p.is_file()):
            rel = path.relative_to(self.dir).as_posix()
            if rel == MANIFEST_NAME:
                raise RuntimeError("steps must not write manifest.json themselves")
            files[rel] = FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)
        dest_abs = self.dest.resolve()
        inputs = [
            InputRef(
                role=ref.role,
                path=os.path.relpath(ref.path, dest_abs),
                id=ref.id,
                manifest_sha256=ref.manifest_sha256,
                kind=ref.kind,
            )
            for ref in self.plan.inputs
        ]
        manifest = Manifest(
            kind=self.plan.kind,
            kind_version=self.plan.kind_version,
            id=self.plan.id,
            uqc_version=__version__,
            created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
            step=self.plan.step,
            config={**self.plan.config, **self.extra_config},
            inputs=inputs,
            files=files,
            data=self.plan.data,
            env=_env(self.plan.device),
            summary=self.summary,
            warnings=self.warnings,
        )
        return manifest

    def _install(self) -> None:
        """Rename the finished temp dir onto the destination.

        With ``force``, an existing artifact is moved aside first and deleted only once the new
        one is in place; if that rename fails, the old one is put back.
        """
        trash: Path | None = None
        if self.dest.is_dir() and not self.dest.is_symlink():
            if not any(self.dest.iterdir()):
                self.dest.rmdir()
            elif self.force or self._stale_at_dest():
                # Checked again here: the folder may have changed while the step ran.
                refuse_unless_replaceable(self.dest)
                trash = self.dest.parent / sibling_temp_name(
                    self.dest.name, f".old-{secrets.token_hex(4)}"
                )
                try:
                    os.rename(self.dest, trash)
                except OSError as exc:
                    raise ArtifactError(
                        f"cannot move the old artifact {self.dest} aside: {exc.strerror or exc}",
                        hint="choose another --out",
                    ) from exc
        try:
            os.rename(self.dir, self.dest)
        except OSError as exc:
            if trash is not None:
                self._restore(trash, exc)
            # Another process finished the same artifact first: keep theirs if it is the same id.
            try:
                theirs = read_manifest(self.dest)
            except UqcError:
                theirs = None
            shutil.rmtree(self.dir, ignore_errors=True)
            if theirs is not None and theirs.id == self.plan.id:
                return
            if not self.dest.exists():
                raise ArtifactError(
                    f"cannot write --out {self.dest}: {exc.strerror or exc}",
                    hint="choose an --out in a writable directory",
                ) from exc
            raise ArtifactError(
                f"--out {self.dest} was written by another process while this step ran",
                hint="choose another --out, or pass --force to replace it",
            ) from None
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)

    def _stale_at_dest(self) -> bool:
        """Whether dest holds this artifact made from an input that was replaced since."""
        try:
            theirs = read_manifest(self.dest)
        except UqcError:
            return False
        same = theirs.id == self.plan.id and theirs.kind == self.plan.kind
        return same and stale_input(theirs, self.plan) is not None

    def _restore(self, trash: Path, exc: OSError) -> None:
        """The new artifact could not be renamed into place: put the old one back."""
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.rename(trash, self.dest)
        except OSError:
            raise ArtifactError(
                f"cannot replace {self.dest} ({exc.strerror or exc}), nor put the previous "
                f"artifact back from {trash}",
                hint=f"move {trash} back to {self.dest} yourself",
            ) from exc
        raise ArtifactError(
            f"cannot replace {self.dest}: {exc.strerror or exc}; the previous artifact is kept",
            hint="choose another --out",
        ) from exc


def apply_umask_modes(directory: Path) -> None:
    """Give every file and folder under ``directory`` the mode a plain ``open`` would.

    Libraries write some files through private temp files (safetensors' ``model.safetensors``
    came out 0600 beside 0644 JSON files): one artifact gets one file mode, from the umask.
    """
    mask = os.umask(0)
    os.umask(mask)  # reading the umask means setting it; put it straight back
    for path in directory.rglob("*"):
        if path.is_symlink():
            continue
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def clean_stale_temp_dirs(root: Path) -> list[Path]:
    """Remove temp dirs that killed processes of this host left (their pid no longer runs).

    Temp dirs of other hosts (a shared artifacts folder) are never touched. Returns the removed.
    """
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    host = _host_tag()
    for entry in root.iterdir():
        if not (entry.is_dir() and entry.name.startswith(".") and TMP_MARKER in entry.name):
            continue
        parts = entry.name.rsplit(TMP_MARKER, 1)[1].split("-")
        if len(parts) != 3 or parts[2] != host or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        if not _pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
