"""TeaCache's rescaling of a probe's raw relative-L1 change: the published polynomial
evaluated at it.

The polynomials and their provenance live in ``registry/teacache.py``; FLUX.1-dev's is
the default, as ``np.poly1d([4.98651651e+02, -2.83781631e+02, 5.58554382e+01,
-3.82021401e+00, 2.64230861e-01])`` in ali-vilab/TeaCache's
``TeaCache4FLUX/teacache_flux.py``.
"""

from __future__ import annotations

from diffserve.config.stage_sections import CacheConfig
from diffserve.errors import ConfigError
from diffserve.registry.teacache import AUTO, TEACACHE_POLYNOMIALS, TeaCachePolynomial

FLUX_COEFFICIENTS: tuple[float, ...] = TEACACHE_POLYNOMIALS["flux.1-dev"].coefficients


def rescale(
    relative_l1: float, coefficients: tuple[float, ...] = FLUX_COEFFICIENTS
) -> float:
    """The polynomial at ``relative_l1`` (Horner's rule; the same value ``np.poly1d``
    gives)."""
    value = 0.0
    for coefficient in coefficients:
        value = value * relative_l1 + coefficient
    return value


def stage_polynomial(
    cache: CacheConfig, implementation: str, stage_id: int, model_fit: str | None
) -> TeaCachePolynomial | None:
    """The polynomial a stage's TeaCache runs (``None`` for another backend): the one
    the config names, or with ``auto`` the model's own fit ``model_fit``. Refused, with
    the choices, when the model has no fit or the named one was fitted on another
    denoiser's probe."""
    if cache.backend != "teacache":
        return None
    path = f"stages.{stage_id}.cache.teacache_coefficients"
    usable = [
        p.name
        for p in TEACACHE_POLYNOMIALS.values()
        if p.implementation == implementation
    ]
    name = (
        model_fit
        if cache.teacache_coefficients == AUTO
        else cache.teacache_coefficients
    )
    if name is None:
        raise ConfigError(
            "cache.backend='teacache' has no published polynomial fitted on this model",
            path=path,
            hint="use cache.backend: fbcache (First-Block Cache); or, "
            "for a fine-tune of a "
            f"fitted checkpoint, set cache.teacache_coefficients to one of {usable}",
        )
    polynomial = TEACACHE_POLYNOMIALS[name]
    if polynomial.implementation != implementation:
        raise ConfigError(
            f"cache.teacache_coefficients={name!r} was fitted on "
            f"{polynomial.fitted_on}'s "
            f"{polynomial.probe}, which the {implementation} denoiser does not have",
            path=path,
            hint=f"use auto or one of {usable}",
        )
    return polynomial
