"""What a model kind is (`ModelKind`), and the config fields that mark each kind.

A leaf: each kind's module (`hydra_model.py`, `sve_model.py`, `director_model.py`,
`mc_dropout_model.py`, and `surgery.py` for a head-pruned classifier) declares its own
`ModelKind` from here, and the registry (`models/kinds.py`) collects them; nothing here
imports either, so no kind's module imports the registry back.

Torch-free on import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from uqcompress.models.families import Family

# The config fields that mark each kind; the kinds' modules import them from here.
KEPT_HEADS_KEY = "uqc_kept_heads"  # per layer, the ORIGINAL indices of the kept heads
HYDRA_KEY = "uqc_hydra"  # the HydraSpec
SVE_KEY = "uqc_sve"  # the SVESpec
DIRECTOR_KEY = "uqc_director"  # the DirectorSpec
MC_DROPOUT_KEY = "uqc_mc_dropout"  # the MCDropoutSpec
CALIBRATION_KEY = "uqc_calibration"  # `uqc calibrate`'s temperature and abstention rule


@dataclass(frozen=True)
class ModelKind:
    """One kind of model directory.

    `key` is the config field holding the kind's layout (None: a plain classifier, which
    transformers loads by itself). `described` completes "PATH is ...", `noun` completes
    "cannot load the ...", `remake` is the command that writes one (None: plain). `skeleton`
    builds the empty module the layout describes, to load the weights into. `ensemble`: M
    predictions per input from one module; a step that works on one classifier refuses it
    and suggests `refusal` (its `{step}` filled in). `summarise` gives the numbers its
    artifact's summary adds.
    """

    name: str
    key: str | None
    described: str
    noun: str
    remake: str | None
    skeleton: Callable[[Any, Family], nn.Module] | None = None
    ensemble: bool = False
    refusal: str | None = None
    # What a model artifact's summary says about a loaded model of this kind, beyond family,
    # sizes and labels (members, method, the layout's numbers).
    summarise: Callable[[Any], dict[str, Any]] | None = None

    def marks(self, config: Any) -> bool:
        """Whether `config` (a transformers config, or config.json as a dict) is this kind's."""
        if self.key is None:
            return False
        if isinstance(config, Mapping):
            return config.get(self.key) is not None
        return getattr(config, self.key, None) is not None

    def refusal_hint(self, step: str) -> str:
        """What a step that works on one classifier suggests instead of this model."""
        return (self.refusal or "{step} a single classifier").format(step=step)

    def members(self, config: Any) -> int:
        """Predictions per input: the ensemble's M (DIRECTOR: its samples S), else 1."""
        if not self.ensemble or self.key is None:
            return 1
        raw: Any = (
            config.get(self.key) if isinstance(config, Mapping) else getattr(config, self.key)
        )
        return int(raw["members"])
