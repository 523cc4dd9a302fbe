"""MC Dropout (Gal & Ghahramani, 2016) as an ensemble: S dropout samples of one classifier.

Here: the rate a model's own config implies, and building the model from a classifier. The
module, its dropout sites and its per-example masks are `models/mc_dropout_model.py`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from uqcompress.errors import ConfigError
from uqcompress.models.kind_base import MC_DROPOUT_KEY
from uqcompress.models.mc_dropout_model import MCDropoutModel, MCDropoutSpec, mc_dropout_family

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel


def build_mc_dropout(loaded: LoadedModel, samples: int, rate: float, seed: int) -> LoadedModel:
    """The MC Dropout model of a classifier: its weights unchanged, S samples at rate p. The
    input `loaded` is left as it was."""
    family = mc_dropout_family(loaded.family)
    if samples < 1:
        raise ConfigError(f"--samples {samples} must be at least 1", hint="pass --samples 10")
    if not 0 <= rate < 1:
        raise ConfigError(f"--rate {rate} is outside [0, 1)", hint="pass --rate 0.1")
    inner: Any = copy.deepcopy(loaded.model)
    spec = MCDropoutSpec(samples=samples, rate=rate, seed=seed)
    setattr(inner.config, MC_DROPOUT_KEY, spec.to_dict())
    model = MCDropoutModel(inner, family, spec)
    model.eval()
    return loaded.derived(model, inner.config)
