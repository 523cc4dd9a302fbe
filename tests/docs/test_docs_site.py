"""The README and the documentation site (docs/, mkdocs.yml) hold together.

Every shell block is run by a test or says why it cannot be; the README stays short and its
file links resolve; every page is in the site's nav. `mkdocs build --strict` itself (links and
anchors between pages) runs in `make docs-site`, which `make test` runs before pytest.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
WALKTHROUGH = DOCS / "guide" / "walkthrough.md"
START, END = "<!-- steps-by-example:start -->", "<!-- steps-by-example:end -->"
SHELLS = ("sh", "bash", "shell", "console")
# A block another test runs as written, outside the walk-through: `<!-- run-by: tests/... -->`.
MARK = re.compile(r"^<!-- (not-run|run-by): (\S.*?) -->$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
README_MAX_LINES = 250


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _shell_blocks(path: Path) -> list[tuple[int, str, str, bool]]:
    """(line, the block's text, the mark before it, whether it lies in the walk-through)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks, walk = [], False
    i = 0
    while i < len(lines):
        line = lines[i]
        walk = (walk or line.strip() == START) and line.strip() != END
        match = FENCE.match(line)
        if not match:
            i += 1
            continue
        indent, language = match.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        if language in SHELLS:
            body = "\n".join(text[len(indent) :] for text in lines[i + 1 : end])
            before = next((text.strip() for text in reversed(lines[:i]) if text.strip()), "")
            blocks.append((i + 1, body.strip(), before, walk))
        i = end + 1
    return blocks


def _walkthrough_blocks() -> set[str]:
    return {body for _, body, _, walk in _shell_blocks(WALKTHROUGH) if walk}


def test_every_shell_block_is_run_or_says_why_not() -> None:
    run = _walkthrough_blocks()
    assert len(run) > 20  # the walk-through was found
    unaccounted = []
    for path in [ROOT / "README.md", *_pages()]:
        for line, body, before, walk in _shell_blocks(path):
            mark = MARK.match(before)
            if walk or body in run:
                continue
            if mark and mark.group(1) == "run-by":
                assert (ROOT / mark.group(2).split("::")[0]).is_file(), f"{path}:{line}: {before}"
                continue
            if mark and len(mark.group(2)) >= 10:  # a reason, not a placeholder
                continue
            unaccounted.append(f"{path.relative_to(ROOT)}:{line}: {body.splitlines()[0]}")
    assert unaccounted == [], (
        "shell blocks no test runs: move them into the walk-through "
        "(docs/guide/walkthrough.md), or precede them with <!-- not-run: why -->:\n"
        + "\n".join(unaccounted)
    )


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_readme_links_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert any(target.startswith("docs/") for target in targets)
    missing = [
        target
        for target in targets
        if "://" not in target
        and not target.startswith("#")
        and not (ROOT / target.split("#")[0]).exists()
    ]
    assert missing == [], f"README.md links to files that do not exist: {missing}"


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = [path.relative_to(DOCS).as_posix() for path in _pages()]
    assert sorted(set(nav) - set(pages)) == [], "the nav names pages that do not exist"
    assert sorted(set(pages) - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
