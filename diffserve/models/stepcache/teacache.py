"""TeaCache's rescaling of the raw relative-L1 change of block 0's modulated input, for FLUX.

Provenance: ali-vilab/TeaCache, ``TeaCache4FLUX/teacache_flux.py`` (``teacache_forward``), where
``np.poly1d([4.98651651e+02, -2.83781631e+02, 5.58554382e+01, -3.82021401e+00, 2.64230861e-01])`` is
applied to ``mean|m_t - m_prev| / mean|m_prev|`` and accumulated until it reaches ``rel_l1_thresh``.
The polynomial was fitted on FLUX.1-dev; highest power first, as ``np.poly1d`` takes it. A transcription
slip here once made a peer's cache never fire: ``tests/models/test_step_cache.py`` recomputes a value by
hand, so a changed digit fails a test.
"""

from __future__ import annotations

FLUX_COEFFICIENTS: tuple[float, ...] = (4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01)


def rescale(relative_l1: float, coefficients: tuple[float, ...] = FLUX_COEFFICIENTS) -> float:
    """The polynomial at ``relative_l1`` (Horner's rule; the same value ``np.poly1d`` gives)."""
    value = 0.0
    for coefficient in coefficients:
        value = value * relative_l1 + coefficient
    return value
