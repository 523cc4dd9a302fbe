"""Model kinds: what a model directory holds, told by one field of its config.json.

A plain classifier loads with transformers. Every other kind records its layout under its
own config key, and loads by building the empty module that layout describes (its
*skeleton*) and then reading the weights into it strictly, under the module's own names.

Each kind declares itself in its own module, as a `ModelKind` (`models/kind_base.py`): how
to recognise it, build its skeleton, name it in messages, re-create it, what its summary
says, and what a step that takes one classifier suggests instead of it. This registry only
collects them, in the order they are recognised; the kinds' modules never import it back.

Calibration is not a kind but a property any kind can carry (`kind_base.CALIBRATION_KEY`):
the loader takes it out of the config, so a model derived from a calibrated one is not
calibrated.

A new kind: its `nn.Module`, `*_skeleton(config, family)` and `ModelKind` in
`models/<kind>_model.py`, and one line in `registered_kinds`, before any kind it is made
from (an SVE of a pruned model records both keys and is an SVE).

Torch-free on import: the kinds' modules (torch, transformers) are imported on the first
lookup.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from uqcompress.models.kind_base import ModelKind

PLAIN = ModelKind(
    name="plain",
    key=None,
    described="a classifier",
    noun="model",
    remake=None,  # transformers loads and saves it; there is nothing of ours to re-create
)


@cache
def registered_kinds() -> tuple[ModelKind, ...]:
    """Every kind, in the order they are recognised: ensembles first (one may be made from a
    pruned model, and then records the kept heads too), plain last (it marks nothing)."""
    from uqcompress.models.director_model import DIRECTOR
    from uqcompress.models.hydra_model import HYDRA
    from uqcompress.models.mc_dropout_model import MC_DROPOUT
    from uqcompress.models.surgery import PRUNED
    from uqcompress.models.sve_model import SVE

    return (HYDRA, SVE, DIRECTOR, MC_DROPOUT, PRUNED, PLAIN)


def kind_summary(loaded: Any) -> dict[str, Any]:
    """What a model artifact's summary says about the kind of `loaded` (a LoadedModel)."""
    kind = kind_of(loaded.config)
    return kind.summarise(loaded) if kind.summarise is not None else {}


def kind_of(config: Any) -> ModelKind:
    """The kind of a model, from its transformers config or its config.json as a dict (read
    without loading the weights, so steps can refuse before any work)."""
    return next((kind for kind in registered_kinds() if kind.marks(config)), PLAIN)
