"""`uqc inspect` and `uqc verify`: what an artifact is, where it came from, is it intact."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from uqcompress.cli.options import Json, Quiet, Verbose, resolve_input


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def inspect(
    artifact: Annotated[str, typer.Argument(help="Artifact directory ('-' reads stdin).")],
    json_out: Json = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Show kind, summary, config, data and lineage (table on stderr; --json on stdout)."""
    from dataclasses import asdict

    from rich.table import Table
    from rich.tree import Tree

    from uqcompress.artifacts import read_manifest
    from uqcompress.artifacts.lineage import walk_lineage
    from uqcompress.runtime.console import plain, stderr, user

    path = resolve_input(artifact)
    manifest = read_manifest(path)
    lineage = walk_lineage(path)
    if json_out:
        payload = {
            "path": str(path),
            "manifest": manifest.to_dict(),
            "lineage": [asdict(node) for node in lineage],
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    table = Table(title=plain(f"{manifest.kind} artifact {path}"), show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    table.add_row("kind", f"{manifest.kind} (kind_version {manifest.kind_version})")
    table.add_row("step", manifest.step)
    table.add_row("id", manifest.id)
    table.add_row("created", f"{manifest.created_utc} by uqc {manifest.uqc_version}")
    for key, value in manifest.summary.items():
        table.add_row(plain(f"summary.{key}"), plain(_short(value)))
    for key, value in manifest.config.items():
        table.add_row(plain(f"config.{key}"), plain(_short(value)))
    for entry in manifest.data:
        table.add_row(
            plain(f"data.{entry.get('role')}"),
            plain(
                f"{entry.get('spec')} ({entry.get('examples')} examples, "
                f"fingerprint {str(entry.get('fingerprint'))[:12]})"
            ),
        )
    table.add_row("env", plain(_short(manifest.env, 120)))
    for warning in manifest.warnings:
        table.add_row("warning", plain(warning))
    stderr.print(table)
    tree = Tree(f"[bold]lineage[/bold] {manifest.kind}/{manifest.step} {manifest.id[:8]}")
    branches = {0: tree}
    for node in lineage[1:]:
        parent = branches.get(node.depth - 1, tree)
        status = "" if node.status == "ok" else f" [red]({node.status})[/red]"
        branches[node.depth] = parent.add(
            f"{user(node.role)}: {node.kind}/{node.step} {node.id[:12]} {user(node.path)}{status}"
        )
    stderr.print(tree)
    sys.stdout.write(f"{path}\n")


def verify(
    artifact: Annotated[str, typer.Argument(help="Artifact directory ('-' reads stdin).")],
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Check every file of an artifact against its recorded size and sha256, and that it holds
    only regular files and no path leading out of it, and that every input up its lineage is
    still the one it was made from (exit 1 if not)."""
    from uqcompress.artifacts import open_artifact
    from uqcompress.artifacts.lineage import check_inputs_current
    from uqcompress.export.contract import ONNX_FILE
    from uqcompress.runtime.console import stderr, user

    path = resolve_input(artifact)
    opened = open_artifact(path, verify=True)
    check_inputs_current(path)
    if opened.kind == "onnx" and ONNX_FILE in opened.manifest.files:
        # paths inside the model (tokenizer, external data) must stay in the artifact too
        from uqcompress.export.runtime import check_onnx_paths

        check_onnx_paths(opened.file(ONNX_FILE))
    stderr.print(
        f"[green]ok[/green] {opened.kind} artifact {user(path)}: "
        f"{len(opened.manifest.files)} files match their sha256"
    )
    sys.stdout.write(f"{path}\n")
