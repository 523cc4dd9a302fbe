"""Uncertainty quantification: torch ops for ensemble outputs and numpy calibration metrics."""
