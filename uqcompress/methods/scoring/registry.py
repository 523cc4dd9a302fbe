"""Every head scorer, collected from its module's `SCORER` record, in the order `uqc score
--method`'s help lists them. `steps/score.py` and the CLI ask here (by name, or for the
scorers that need data or search); nothing else lists scorers.

Torch-free to import (the scorer modules import torch inside their functions), so `uqc --help`
can build its text from here.
"""

from __future__ import annotations

from uqcompress.methods.scoring import circuit, headmap, hies, l2, random_baseline, taylor
from uqcompress.methods.scoring.scorer import Scorer

# Gradient scorers, the two searches, then the data-free baselines: the order help texts list.
SCORERS: tuple[Scorer, ...] = (
    taylor.SCORER,
    hies.SCORER,
    headmap.SCORER,
    circuit.SCORER,
    random_baseline.SCORER,
    l2.SCORER,
)

_BY_NAME: dict[str, Scorer] = {
    name: scorer for scorer in SCORERS for name in (scorer.name, *scorer.aliases)
}


def names() -> tuple[str, ...]:
    """Every scorer's current name, in help order (aliases left out)."""
    return tuple(scorer.name for scorer in SCORERS)


def find(name: str | None) -> Scorer | None:
    """The scorer called `name` now or formerly (an alias); None for an unknown name."""
    return _BY_NAME.get(name) if name is not None else None


def is_searched(name: object) -> bool:
    """Whether scores of method `name` (a summary's `method`, aliases included: artifacts
    written before a rename say the old name) are a searched set of kept heads."""
    scorer = find(name) if isinstance(name, str) else None
    return scorer is not None and scorer.searched


def needing_data() -> tuple[str, ...]:
    """The scorers that need labelled calibration data (--data), in help order."""
    return tuple(scorer.name for scorer in SCORERS if scorer.needs_data)


def searching() -> tuple[str, ...]:
    """The scorers that search for a head budget (--ratio, --ood), in help order."""
    return tuple(scorer.name for scorer in SCORERS if scorer.searched)


def method_help() -> str:
    """`--method`'s help: every scorer, its note in brackets, `... or last.`"""
    parts = [scorer.help() for scorer in SCORERS]
    return f"{', '.join(parts[:-1])} or {parts[-1]}." if len(parts) > 1 else f"{parts[0]}."
