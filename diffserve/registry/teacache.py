"""TeaCache's published rescaling polynomials, by name: which denoiser and probe each
was fitted on, the steps its recipe always computes, its suggested threshold, and where
every number comes from.

TeaCache accumulates ``poly(mean|p_t - p_prev| / mean|p_prev|)`` over the steps since
the last computed one and skips while the sum stays below the threshold; ``p`` is the
probe. A polynomial is fitted on one checkpoint and one probe, so it says nothing about
other sizes: ``cache.teacache_coefficients: auto`` takes the model's own
(``polynomial_for``) and a model with none refuses TeaCache unless the deploy names one
explicitly (a fine-tune of a published checkpoint may reasonably reuse its parent's).
Coefficients are highest power first, as ``np.poly1d`` takes them;
``tests/models/test_step_cache.py`` recomputes values by hand, so a changed digit fails
a test (a transcription slip once made a peer's cache never fire).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diffserve.registry.targets import spelling_table

AUTO = "auto"
TEACACHE4WAN = "ali-vilab/TeaCache TeaCache4Wan2.1/teacache_generate.py"


@dataclass(frozen=True)
class TeaCachePolynomial:
    name: str
    # The native denoiser whose probe it was fitted on: "flux" or "wan".
    implementation: str
    coefficients: tuple[float, ...]
    probe: str  # what the relative L1 change is measured on
    retention_steps: int  # first steps the recipe always computes
    default_threshold: float
    fitted_on: str
    provenance: str


TEACACHE_POLYNOMIALS: dict[str, TeaCachePolynomial] = {
    p.name: p
    for p in (
        TeaCachePolynomial(
            "flux.1-dev",
            "flux",
            (
                4.98651651e02,
                -2.83781631e02,
                5.58554382e01,
                -3.82021401e00,
                2.64230861e-01,
            ),
            "modulated_input",
            1,
            0.6,
            "FLUX.1-dev",
            "ali-vilab/TeaCache TeaCache4FLUX/teacache_flux.py "
            "(rel_l1_thresh 0.6, its '2.0x' setting)",
        ),
        # use_ret_steps=False: its README says retention steps help every Wan2.1 model
        # except t2v-1.3B. The probe is the timestep embedding ``e`` (diffusers'
        # ``temb``); the first step and the last always compute.
        TeaCachePolynomial(
            "wan2.1-t2v-1.3b",
            "wan",
            (
                2.39676752e03,
                -1.31110545e03,
                2.01331979e02,
                -8.29855975e00,
                1.37887774e-01,
            ),
            "timestep_embedding",
            1,
            0.08,
            "Wan2.1-T2V-1.3B",
            f"{TEACACHE4WAN} (use_ret_steps False; README: 0.05 slow, 0.08 fast)",
        ),
        # use_ret_steps=True: the probe is the timestep modulation ``e0`` (diffusers'
        # ``timestep_proj``) and the first five steps always compute.
        TeaCachePolynomial(
            "wan2.1-t2v-14b",
            "wan",
            (
                -3.03318725e05,
                4.90537029e04,
                -2.65530556e03,
                5.87365115e01,
                -3.15583525e-01,
            ),
            "timestep_modulation",
            5,
            0.2,
            "Wan2.1-T2V-14B",
            f"{TEACACHE4WAN} (use_ret_steps True; README: 0.10 slow, 0.20 fast)",
        ),
    )
}

# Wan2.1 T2V transformer shapes the polynomials were fitted on: (heads, head dim,
# layers, ffn dim).
_WAN_SHAPES: dict[tuple[Any, ...], str] = {
    (12, 128, 30, 8960): "wan2.1-t2v-1.3b",
    (40, 128, 40, 13824): "wan2.1-t2v-14b",
}


def teacache_spellings() -> dict[str, str]:
    # Spellings are compared with "-" read as "_" (config/canonical.py): the names' own
    # dashes too.
    return spelling_table(
        list(TEACACHE_POLYNOMIALS),
        {n.replace("-", "_"): n for n in TEACACHE_POLYNOMIALS if "-" in n},
        extra=(AUTO,),
    )


def polynomial_for(
    class_name: str, transformer_config: Mapping[str, Any], experts: int = 1
) -> tuple[str, str] | None:
    """The published polynomial that fits this model and why, or ``None``. FLUX
    pipelines take FLUX.1-dev's (the only FLUX fit); a Wan text-to-video model of one
    expert with a fitted checkpoint's exact shape takes its own. Wan2.2's experts and
    image-to-video models have no published fit."""
    if class_name == "FluxPipeline":
        return "flux.1-dev", "FluxPipeline: TeaCache4FLUX's fit (FLUX.1-dev)"
    if (
        class_name != "WanPipeline"
        or experts != 1
        or transformer_config.get("in_channels") != 16
    ):
        return None
    shape = tuple(
        transformer_config.get(key)
        for key in (
            "num_attention_heads",
            "attention_head_dim",
            "num_layers",
            "ffn_dim",
        )
    )
    name = _WAN_SHAPES.get(shape)
    if name is None:
        return None
    return (
        name,
        f"transformer/config.json: {shape[0]} heads of {shape[1]}, {shape[2]} layers: "
        f"{TEACACHE_POLYNOMIALS[name].fitted_on}'s shape",
    )
