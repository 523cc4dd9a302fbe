"""Attention-head importance scores: Taylor (Michel et al.), HIES, HeadMap, greedy circuit,
random, L2. One module per scorer; `common` holds the conventions every scorer follows (an
`[L, H]` float32 tensor on CPU, higher = keep first, NaN in a pruned layer's absent slots) and
the helpers they share, `search` what the two circuit searches share.

Layout:

    scorer.py            the `Scorer` record and the `ScoreRequest` a scorer's function gets
    registry.py          collects every scorer module's `SCORER`, in help order
    common.py, search.py shared helpers (the only modules a scorer module may import from here)
    taylor.py, hies.py, headmap.py, circuit.py, random_baseline.py, l2.py   one scorer each

Adding a scorer takes one new file (and its test), `methods/scoring/NAME.py`:

    1. the math: functions taking a `LoadedModel` (and batches), returning `[L, H]` scores,
       with `Shape:` docstrings; torch imported inside them, since the registry, and with it
       `uqc --help`, imports the module;
    2. `_score(request: ScoreRequest) -> ScoreResult`, reading its options by config field
       name from `request.options` and its batches from `request.calibration()`;
    3. `SCORER = Scorer(name=..., score=_score, needs_data=..., searched=...)` (and `about`,
       `aliases`, `id_config`, `own_options`, `check` where it has them);

and naming it in `registry.py`'s import and `SCORERS` (its place there is its place in the
help). `uqc score --method`, its choices, its help and its checks then know it; a new config
field it reads goes in `steps/score.py`'s `ScoreConfig`, with its help (the command line
is generated from it). Scorer modules
never import one another (an import-linter contract in pyproject.toml).

Every name below is importable from here, as before the split (`from
uqcompress.methods.scoring import taylor_scores`); they load on first use, so importing the
package (for the registry) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uqcompress.methods.scoring.circuit import circuit_evaluations, circuit_scores
    from uqcompress.methods.scoring.common import (
        NORM_SCOPES,
        absent_slots,
        head_counts,
        minmax,
        pad_rows,
    )
    from uqcompress.methods.scoring.headmap import (
        example_losses,
        headmap_evaluations,
        headmap_scores,
        lowest_loss,
    )
    from uqcompress.methods.scoring.hies import HIS_ABS, attention_entropy, hies_scores
    from uqcompress.methods.scoring.l2 import l2_scores
    from uqcompress.methods.scoring.random_baseline import random_head_scores, random_scores
    from uqcompress.methods.scoring.taylor import gate_gradient, taylor_scores

# name -> the module (under this package) that defines it
_HOMES = {
    "HIS_ABS": "hies",
    "NORM_SCOPES": "common",
    "absent_slots": "common",
    "attention_entropy": "hies",
    "circuit_evaluations": "circuit",
    "circuit_scores": "circuit",
    "example_losses": "headmap",
    "gate_gradient": "taylor",
    "head_counts": "common",
    "headmap_evaluations": "headmap",
    "headmap_scores": "headmap",
    "hies_scores": "hies",
    "l2_scores": "l2",
    "lowest_loss": "headmap",
    "minmax": "common",
    "pad_rows": "common",
    "random_head_scores": "random_baseline",
    "random_scores": "random_baseline",
    "taylor_scores": "taylor",
}

__all__ = [
    "HIS_ABS",
    "NORM_SCOPES",
    "absent_slots",
    "attention_entropy",
    "circuit_evaluations",
    "circuit_scores",
    "example_losses",
    "gate_gradient",
    "head_counts",
    "headmap_evaluations",
    "headmap_scores",
    "hies_scores",
    "l2_scores",
    "lowest_loss",
    "minmax",
    "pad_rows",
    "random_head_scores",
    "random_scores",
    "taylor_scores",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
