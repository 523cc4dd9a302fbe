"""The test folders are not packages, so pytest imports each test file by its base name: two
files with one name in different folders stop the whole run at collection ("import file
mismatch"). Caught here by name, before a run gets that far on another machine."""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_file_has_its_own_base_name() -> None:
    paths = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        paths[path.name].append(str(path.relative_to(TESTS)))
    assert len(paths) > 100  # the suite was found
    repeated = {name: where for name, where in paths.items() if len(where) > 1}
    assert repeated == {}, f"rename one of each (subject suffix, CONTRIBUTING.md): {repeated}"
