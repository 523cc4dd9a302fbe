"""The one stderr console: progress, tables and logs never touch stdout (it carries results).

User values (paths, data specs, labels, recipe text, warnings) are printed as they are:
the console never turns `:smile:` into an emoji, and `user()` / `plain()` keep rich from
reading `[red]` in a value as markup."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

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
