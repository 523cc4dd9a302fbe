"""mkdocs hooks (mkdocs.yml `hooks:`): the pages stay GitHub-flavoured Markdown, the site renders
them the same.

In a GitHub table a `|` inside a code span must be written `\\|`; Python-Markdown already keeps
code spans whole when it splits a row, and would print the backslash. So on the site, `\\|`
inside a table row's code spans becomes `|`.
"""

from __future__ import annotations

import re
from typing import Any

_CODE_SPAN = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **_: Any) -> str:
    lines, fence = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and line.startswith("|"):
            line = _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
        lines.append(line)
    return "\n".join(lines)
