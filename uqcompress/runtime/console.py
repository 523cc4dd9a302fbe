"""The one stderr console: progress, tables and logs never touch stdout (it carries results).

User values (paths, data specs, labels, recipe text, warnings) are printed as they are:
the console never turns `:smile:` into an emoji, and `user()` / `plain()` keep rich from
reading `[red]` in a value as markup."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.text import Text

T = TypeVar("T")

# Off a terminal (logs, CI, pipes) rich assumes 80 columns and would truncate table cells;
# give it room unless the user set COLUMNS.
_WIDTH = None if sys.stderr.isatty() or "COLUMNS" in os.environ else 160

stderr = Console(stderr=True, highlight=False, width=_WIDTH, emoji=False)


def user(value: Any) -> str:
    """A user value for a markup string (`f"[dim]{user(path)}...[/dim]"`): escaped."""
    return escape(str(value))


def plain(value: Any) -> Text:
    """A user value as a table cell, title or tree label: printed as written, no markup."""
    return Text(str(value))


# --- how much a command says (-q / -v) ------------------------------------------------------

QUIET, NORMAL, VERBOSE = -1, 0, 1
_level = NORMAL


def set_verbosity(level: int) -> None:
    """QUIET: stderr carries errors only (no progress, tables or warnings; warnings stay in
    the manifest); NORMAL; VERBOSE: also each phase of a step and what it cost. Every command
    starts at NORMAL (`cli.app.run` resets it), so one in-process call never leaks into the
    next."""
    global _level
    _level = level
    stderr.quiet = level <= QUIET


def is_verbose() -> bool:
    return _level >= VERBOSE


def detail(message: str) -> None:
    """A line only -v prints (markup allowed: pass user values through `user()`)."""
    if is_verbose():
        stderr.print(f"[dim]{message}[/dim]", soft_wrap=True, highlight=False)


@contextmanager
def phase(what: str) -> Iterator[None]:
    """Time a phase of a step; with -v, print what it was and the seconds it took (also when
    it failed, so the last line before an error says where it happened)."""
    if not is_verbose():
        yield
        return
    start = time.perf_counter()
    outcome = "failed after"
    try:
        yield
        outcome = "took"
    finally:
        _timed_line(what, outcome, start)


def _timed_line(what: str, outcome: str, start: float) -> None:
    """`  WHAT took|failed after N s`, the line -v prints when a phase ends."""
    seconds = time.perf_counter() - start
    stderr.print(f"[dim]  {what} {outcome} {seconds:.2f} s[/dim]", soft_wrap=True)


def error_line(markup: str) -> None:
    """An error's one line: printed whatever the verbosity (-q hides all but errors)."""
    quiet, stderr.quiet = stderr.quiet, False
    try:
        stderr.print(markup, soft_wrap=True, markup=True, highlight=False)
    finally:
        stderr.quiet = quiet


# --- progress while a step works ----------------------------------------------------------


def _shows_live() -> bool:
    """Spinners and bars only on a terminal, and not under -q: logs and pipes stay clean."""
    return stderr.is_terminal and not stderr.quiet


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """`items`, with a transient progress bar on stderr while they are consumed (none off a
    terminal, under -q, or inside another live display such as training's bar)."""
    with counter(description) as report:
        for done, item in enumerate(items, 1):
            yield item
            report(done, total)


@contextmanager
def counter(description: str) -> Iterator[Callable[[int, int | None], None]]:
    """`with counter("greedy-circuit search") as report: report(done, total)`: a transient
    bar on stderr for work counted by its caller (nothing off a terminal, under -q, or
    inside another live display; `report` then does nothing)."""
    if not _shows_live():
        yield lambda done, total: None
        return
    from rich.errors import LiveError
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    )
    try:
        progress.start()
    except LiveError:
        yield lambda done, total: None
        return
    try:
        task = progress.add_task(description, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)
    finally:
        progress.stop()


class Activity:
    """A step's phases as they happen: a spinner naming the current one on a terminal, and
    with -v a line per finished phase with its seconds."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.current: str | None = None
        self.started = 0.0
        self.status: Any = None

    def step(self, what: str) -> None:
        """The previous phase is done; `what` starts."""
        self._finish("took")
        self.current, self.started = what, time.perf_counter()
        if self.status is not None:
            self.status.update(f"{self.title}: {what}")

    def _finish(self, outcome: str) -> None:
        if self.current is not None and is_verbose():
            _timed_line(self.current, outcome, self.started)
        self.current = None


@contextmanager
def activity(title: str) -> Iterator[Activity]:
    """`with activity("exporting bert to ONNX") as work: work.step("tracing"); ...`"""
    work = Activity(title)
    status = None
    if _shows_live():
        from rich.errors import LiveError

        status = stderr.status(title)
        try:
            status.start()
        except LiveError:
            status = None
    work.status = status
    outcome = "failed after"
    try:
        yield work
        outcome = "took"
    finally:
        work._finish(outcome)
        if status is not None:
            status.stop()
