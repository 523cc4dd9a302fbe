"""Model kinds: what a model directory holds, told by one field of its config.json.

A plain classifier loads with transformers. Every other kind records its layout under its
own config key, and loads by building the empty module that layout describes (its
*skeleton*) and then reading the weights into it strictly, under the module's own names.
The registry below is the one place that knows, per kind, how to recognise it, build its
skeleton, name it in messages, re-create it, and what a step that takes one classifier
suggests instead of it.

Calibration is not a kind but a property any kind can carry (`CALIBRATION_KEY`): the
loader takes it out of the config, so a model derived from a calibrated one is not
calibrated.

A new kind: its `nn.Module` and `*_skeleton(config, family)` in `models/<kind>_model.py`,
and one `ModelKind` entry in `KINDS`, before any kind it is made from (an SVE of a pruned
model records both keys and is an SVE).

Torch-free on import: the skeleton builders import their modules when called.
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
    "cannot load the ...", `remake` is the command that writes one (None: plain). `ensemble`: M
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


def _pruned_skeleton(config: Any, family: Family) -> nn.Module:
    from uqcompress.models.surgery import classifier_skeleton

    module: nn.Module = classifier_skeleton(config, family)
    return module


def _hydra_skeleton(config: Any, family: Family) -> nn.Module:
    from uqcompress.models.hydra_model import HydraModel

    return HydraModel(config, family.name)


def _sve_skeleton(config: Any, family: Family) -> nn.Module:
    from uqcompress.models.sve_model import sve_skeleton

    return sve_skeleton(config, family)


def _director_skeleton(config: Any, family: Family) -> nn.Module:
    from uqcompress.models.director_model import director_skeleton

    return director_skeleton(config, family)


def _mc_dropout_skeleton(config: Any, family: Family) -> nn.Module:
    from uqcompress.models.mc_dropout_model import mc_dropout_skeleton

    return mc_dropout_skeleton(config, family)


def _hydra_summary(loaded: Any) -> dict[str, Any]:
    spec = loaded.model.spec
    return {
        "members": loaded.members,
        "method": "hydra",
        "kept_heads": spec.kept_heads,
        "head_slots_per_layer": [spec.slots(layer) for layer in range(spec.layers)],
        "padding_ratio": round(spec.padding_ratio(), 4),
    }


def _sve_summary(loaded: Any) -> dict[str, Any]:
    spec, inner = loaded.model.spec, loaded.model.inner
    full = [
        min(inner.get_submodule(n).in_features, inner.get_submodule(n).out_features)
        for n in spec.targets
    ]
    return {
        "members": loaded.members,
        "method": "sve",
        "sve_targets": len(spec.targets),
        "sve_rank": "full" if spec.ranks == full else spec.ranks[0],
        "sigma_init": spec.sigma_init,
    }


def _director_summary(loaded: Any) -> dict[str, Any]:
    return {"members": loaded.members, "method": "director", "samples": loaded.members}


def _mc_dropout_summary(loaded: Any) -> dict[str, Any]:
    spec = loaded.model.spec
    return {
        "members": loaded.members,
        "method": "mc-dropout",
        "samples": spec.samples,
        "rate": spec.rate,
        "dropout_sites": loaded.model.sites,
    }


PLAIN = ModelKind(
    name="plain",
    key=None,
    described="a classifier",
    noun="model",
    remake=None,  # transformers loads and saves it; there is nothing of ours to re-create
)
PRUNED = ModelKind(
    name="pruned",
    key=KEPT_HEADS_KEY,
    described="a head-pruned classifier",
    noun="pruned model",
    remake="uqc prune",
    skeleton=_pruned_skeleton,
)
HYDRA = ModelKind(
    name="hydra",
    key=HYDRA_KEY,
    described="a fused Hydra model",
    noun="Hydra model",
    remake="uqc fuse",
    skeleton=_hydra_skeleton,
    ensemble=True,
    refusal="{step} the base model before pruning members and fusing them",
    summarise=_hydra_summary,
)
SVE = ModelKind(
    name="sve",
    key=SVE_KEY,
    described="a Singular Value Ensemble",
    noun="SVE model",
    remake="uqc svd-ensemble",
    skeleton=_sve_skeleton,
    ensemble=True,
    refusal="{step} the base model the ensemble was built from",
    summarise=_sve_summary,
)
DIRECTOR = ModelKind(
    name="director",
    key=DIRECTOR_KEY,
    described="a DIRECTOR student",
    noun="DIRECTOR model",
    remake="uqc distill-director",
    skeleton=_director_skeleton,
    ensemble=True,
    refusal="{step} the teacher it was distilled from",
    summarise=_director_summary,
)

MC_DROPOUT = ModelKind(
    name="mc-dropout",
    key=MC_DROPOUT_KEY,
    described="an MC Dropout model",
    noun="MC Dropout model",
    remake="uqc mc-dropout",
    skeleton=_mc_dropout_skeleton,
    ensemble=True,
    refusal="{step} the base model it was made from",
    summarise=_mc_dropout_summary,
)

# In the order they are recognised: ensembles first (one may be made from a pruned model,
# and then records the kept heads too), plain last (it marks nothing).
KINDS: tuple[ModelKind, ...] = (HYDRA, SVE, DIRECTOR, MC_DROPOUT, PRUNED, PLAIN)


def kind_summary(loaded: Any) -> dict[str, Any]:
    """What a model artifact's summary says about the kind of `loaded` (a LoadedModel)."""
    kind = kind_of(loaded.config)
    return kind.summarise(loaded) if kind.summarise is not None else {}


def kind_of(config: Any) -> ModelKind:
    """The kind of a model, from its transformers config or its config.json as a dict (read
    without loading the weights, so steps can refuse before any work)."""
    return next((kind for kind in KINDS if kind.marks(config)), PLAIN)
