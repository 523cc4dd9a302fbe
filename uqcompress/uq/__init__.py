"""Uncertainty quantification: torch ops for ensemble outputs and numpy calibration metrics."""

from __future__ import annotations

# Version of the one definition of entropy and mutual information (uq/functional.py).
UNCERTAINTY_DEFINITION = "mean-kl-float32-v1"


def numerics_tags() -> dict[str, str]:
    """What fixes a step's predicted numbers besides its config and inputs: the uncertainty
    definition and the sampling models' noise scheme (uq/noise.py). Steps that predict
    (`eval`, `calibrate`, `export`) put these in their artifact id, so changing either changes
    ids."""
    from uqcompress.uq.noise import NOISE_SCHEME

    return {"uncertainty": UNCERTAINTY_DEFINITION, "noise_scheme": NOISE_SCHEME}
