"""docs/models.md's support matrix is the registry's (``registry/support.py``), and what
it claims for the generic families holds when a config is resolved: a step cache only
where it says fbcache, never TeaCache."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.registry.support import COLUMNS, support_matrix, support_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"
GENERIC_FIXTURES = {
    "StableDiffusion3Pipeline": "tiny_sd3_dir",
    "PixArtSigmaPipeline": "tiny_pixart_dir",
    "QwenImagePipeline": "tiny_qwen_image_dir",
    "QwenImageEditPipeline": "tiny_qwen_image_edit_dir",
    "QwenImageEditPlusPipeline": "tiny_qwen_image_edit_plus_dir",
    "QwenImage21Pipeline": "tiny_qwen_image21_dir",
    "ZImagePipeline": "tiny_z_image_dir",
    "Flux2KleinPipeline": "tiny_flux2_klein_dir",
    "Flux2Pipeline": "tiny_flux2_dir",
    "LTX2Pipeline": "tiny_ltx2_dir",
    "HunyuanVideo15Pipeline": "tiny_hunyuan_video15_dir",
}


def test_the_docs_table_is_the_registrys() -> None:
    assert support_table() in DOCS.read_text(encoding="utf-8")
    assert [row[0].strip("`") for row in support_matrix()] == list(MODEL_FAMILIES)
    assert (
        len({len(row) for row in support_matrix()})
        == 1
        == len({len(COLUMNS)} | {len(support_matrix()[0])})
    )


def test_every_generic_family_has_a_test_model() -> None:
    generic = [
        name
        for name, family in MODEL_FAMILIES.items()
        if family.implementation == "generic"
    ]
    assert generic == list(GENERIC_FIXTURES)


@pytest.mark.parametrize("class_name", list(GENERIC_FIXTURES))
def test_step_cache_claims_hold_at_resolve(
    class_name: str, request: pytest.FixtureRequest
) -> None:
    model = request.getfixturevalue(GENERIC_FIXTURES[class_name])
    row = dict(
        zip(
            COLUMNS,
            next(r for r in support_matrix() if r[0] == f"`{class_name}`"),
            strict=True,
        )
    )
    if "fbcache" in row["step cache"]:
        assert (
            resolve(model=model, overrides={"cache": {"backend": "fbcache"}}, env={})
            .stages[0]
            .cache.backend
            == "fbcache"
        )
    else:
        with pytest.raises(ConfigError, match="no step cache"):
            resolve(model=model, overrides={"cache": {"backend": "fbcache"}}, env={})
    with pytest.raises(ConfigError, match="TeaCache"):
        resolve(model=model, overrides={"cache": {"backend": "teacache"}}, env={})
