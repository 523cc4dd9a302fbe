"""The Typer app and the one place where exceptions become messages and exit codes.

Exit codes: 0 ok; 1 a user-facing error (one line: what was wrong, and the fix; set
UQC_DEBUG=1 for the traceback); 2 a usage error (unknown option, missing argument);
3 a quality gate failed; 130 interrupted. Heavy imports (torch, transformers) happen inside
command bodies, so `uqc --help` stays instant.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from uqcompress import __version__
from uqcompress.cli import demo_cmd, inspect_cmd, run_cmd, serve_cmd
from uqcompress.cli.commands import HELP, step_command
from uqcompress.cli.options import Quiet, Verbose
from uqcompress.errors import UqcError
from uqcompress.runtime import interrupts
from uqcompress.runtime.console import NORMAL, set_verbosity

INTERRUPTED = 130

# What rich reads as a markup tag in help text (`[gate]`, `[@split]`, `[/x]`) unless a
# backslash escapes it: rich would swallow it ("then check its  (exit 3 ...)").
_MARKUP_TAG = re.compile(r"(?<!\\)(\[[a-z#/@][^\[\]]*\])")


def escape_help(text: str | None) -> str | None:
    """Help text with every rich markup tag escaped, so it prints as written; idempotent
    (an already escaped `\\[x]` stays as it is)."""
    return _MARKUP_TAG.sub(r"\\\1", text) if text else text


def _escape_command(command: Any) -> None:
    """Escape the help of a command, its parameters and (a group) its subcommands."""
    command.help = escape_help(command.help)
    command.short_help = escape_help(command.short_help)
    for param in command.params:
        help_text = getattr(param, "help", None)
        if help_text:
            param.help = escape_help(help_text)
    for sub in getattr(command, "commands", {}).values():
        _escape_command(sub)


class _PlainHelpCommand(TyperCommand):
    """A command whose help is printed as written: rich renders it, but reads no markup."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _escape_command(self)
        super().format_help(ctx, formatter)


class _PlainHelpGroup(TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        _escape_command(self)
        super().format_help(ctx, formatter)


app = typer.Typer(
    cls=_PlainHelpGroup,
    name="uqc",
    help="uqcompress: smaller transformer classifiers that know when they do not know.\n\n"
    "Every step reads artifact directories and writes a new one; stdout carries only the "
    "path written (or JSON with --json), so steps compose in a shell.",
    no_args_is_help=True,
    # `uqc --install-completion` / `--show-completion`: Typer's, for bash, zsh, fish, PowerShell
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's -h too
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"uqc {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """uqcompress command line."""


def _command(name: str) -> Any:
    return app.command(name, cls=_PlainHelpCommand)


# The commands a step's config generates (cli/commands.py), and those written by hand.
_HAND_WRITTEN = {
    "run": run_cmd.run_recipe,
    "inspect": inspect_cmd.inspect,
    "verify": inspect_cmd.verify,
    "serve": serve_cmd.serve,
    "demo": demo_cmd.demo,
}
# In `uqc --help` order: the pipeline, then what looks at or runs it.
_ORDER = (
    "init", "import", "finetune", "eval", "score", "prune", "fuse", "svd-ensemble",
    "distill-director", "mc-dropout", "calibrate", "export", "quantize", "predict", "compare",
    "run", "inspect", "verify", "serve", "demo",
)  # fmt: skip
assert set(_ORDER) == set(HELP) | set(_HAND_WRITTEN), "a command is missing from _ORDER"
for _name in _ORDER:
    _command(_name)(step_command(_name) if _name in HELP else _HAND_WRITTEN[_name])


def _quiet_libraries() -> None:
    # Library chatter would bury the one line a user needs; steps print their own progress.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _error(message: str) -> None:
    from uqcompress.runtime.console import error_line

    error_line(f"[bold red]error:[/bold red] {message}")


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code (tests call this; `main` exits with it)."""
    _quiet_libraries()
    set_verbosity(NORMAL)  # -q / -v set it again for this command only
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]  # a bare `uqc` shows the help and exits 0
    try:
        interrupts.check()  # a signal during start-up whose KeyboardInterrupt was lost
        result = command.main(args=args, prog_name="uqc", standalone_mode=False)
        # Typer turns KeyboardInterrupt (and so our SIGTERM) into exit code 130 itself.
        code = result if isinstance(result, int) else 0
    except (typer.Abort, KeyboardInterrupt):
        code = INTERRUPTED
    except BaseException as exc:
        # After a signal, whatever else went wrong is its doing (a half-finished import, a
        # library that turned the KeyboardInterrupt into another error): report the signal.
        if not interrupts.interrupted():
            return _failure(exc)
        code = INTERRUPTED
    if code == INTERRUPTED or interrupts.interrupted():
        # Also when the KeyboardInterrupt itself was lost (raised in a __del__, swallowed by a
        # library): the artifact writer refused to install anything once the signal came.
        _error("interrupted; no artifact was written")
        return INTERRUPTED
    return code


def _failure(exc: BaseException) -> int:
    """The exit code of an exception that escaped a command, its one line printed."""
    if isinstance(exc, UqcError):
        if os.environ.get("UQC_DEBUG"):
            raise exc
        hint = f" (fix: {exc.hint})" if exc.hint else ""
        _error(_escape(f"{exc.message}{hint}"))
        return exc.exit_code
    if isinstance(exc, typer.TyperException):
        # Typer's usage errors (unknown option, missing argument, unparsable value) carry
        # exit code 2 and a context naming the command; we keep them to one short line.
        code = int(getattr(exc, "exit_code", 2))
        ctx = getattr(exc, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        sys.stderr.write(f"error: {message}{where}\n")
        return code
    environment = _environment_fault(exc)
    if environment is not None:
        if os.environ.get("UQC_DEBUG"):
            raise exc
        _error(_escape(environment))
        return 1
    raise exc  # anything else is a bug and keeps its traceback


# Faults of the machine, not of uqc: a full disk, a read-only mount, a file size limit, a name
# too long. The writers already removed their temp files; one line says what and how to fix it.
_ENVIRONMENT_FIXES = {
    errno.ENOSPC: "free some space, or choose an --out on another file system",
    errno.EDQUOT: "free some of your quota, or choose an --out on another file system",
    errno.EROFS: "choose an --out on a writable file system",
    errno.EFBIG: "raise the file size limit (ulimit -f unlimited), or write to a file system "
    "that allows larger files",
    errno.ENAMETOOLONG: "choose a shorter --out name (at most 255 bytes per path part)",
}


def _environment_fault(exc: BaseException) -> str | None:
    """The one line of an OSError the environment caused, or None for any other exception."""
    if not isinstance(exc, OSError) or exc.errno not in _ENVIRONMENT_FIXES:
        return None
    reason = exc.strerror or os.strerror(exc.errno)
    where = f" ({exc.filename})" if exc.filename else ""
    return (
        f"{reason}{where}; no output was installed and nothing existing was changed "
        f"(fix: {_ENVIRONMENT_FIXES[exc.errno]})"
    )


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def main() -> None:
    # First line: from here on a signal is recorded as well as raised, so it cannot be lost.
    interrupts.install()
    code: int | None = None
    try:
        code = run()
        interrupts.settle()  # decided: a later signal must not turn it into a kill by signal
    except KeyboardInterrupt:  # a signal that landed outside the command (start-up, teardown)
        interrupts.settle()
        if code is None:
            _error("interrupted; no artifact was written")
            code = INTERRUPTED
    sys.exit(code)
