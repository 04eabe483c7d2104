"""Comparing images made from the same weights by different loading paths."""

from __future__ import annotations

import numpy as np


def same_image(
    ours: np.ndarray, reference: np.ndarray, tolerance: float = 1e-5
) -> bool:
    """``ours`` is ``reference`` up to a GEMM's last-bit rounding: the weights behind
    both are asserted bit-equal and equally aligned by the caller's tests, yet a BLAS
    library may still pick its kernel by where a tensor lies in memory (~1e-7 apart
    where it does), so two loading paths are compared with a tolerance."""
    return (
        ours.shape == reference.shape
        and float(np.abs(ours - reference).max()) <= tolerance
    )
