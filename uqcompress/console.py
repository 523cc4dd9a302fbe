"""The one stderr console: progress, tables and logs never touch stdout (it carries results)."""

from __future__ import annotations

from rich.console import Console

stderr = Console(stderr=True, highlight=False)
