"""The one stderr console: progress, tables and logs never touch stdout (it carries results)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

# Off a terminal (logs, CI, pipes) rich assumes 80 columns and would truncate table cells;
# give it room unless the user set COLUMNS.
_WIDTH = None if sys.stderr.isatty() or "COLUMNS" in os.environ else 160

stderr = Console(stderr=True, highlight=False, width=_WIDTH)
