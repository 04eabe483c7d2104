"""Alias tables: every spelling maps to one canonical value; anything else is a
ConfigError."""

from __future__ import annotations

import pytest

from diffserve.config import canonical as c
from diffserve.config import structured as sv
from diffserve.errors import ConfigError


@pytest.mark.parametrize(
    ("normalize", "spellings", "canonical"),
    [
        (
            c.normalize_dtype,
            ["bf16", "BFloat16", "torch.bfloat16", " bfloat16 "],
            "bfloat16",
        ),
        (c.normalize_dtype, ["fp32", "float", "FLOAT32"], "float32"),
        (c.normalize_dtype, ["fp16", "half", "float16"], "float16"),
        (c.normalize_linear_backend, ["TORCH", "torch", "Torch"], "torch"),
        (
            c.normalize_attention_backend,
            ["SDPA", "torch_sdpa", "TORCH-SDPA", "sdpa"],
            "sdpa",
        ),
        (c.normalize_attention_backend, ["FLASH_ATTN", "flash-attn"], "flash_attn"),
        (c.normalize_executor, ["MP", "mp", "multiprocessing"], "mp"),
        (c.normalize_executor, ["UNI"], "uni"),
        (c.normalize_platform, ["CUDA", "cuda"], "cuda"),
    ],
)
def test_aliases(normalize, spellings, canonical) -> None:
    assert {normalize(s) for s in spellings} == {canonical}


def test_auto_stays_auto_and_is_valid_everywhere() -> None:
    for normalize in (
        c.normalize_dtype,
        c.normalize_linear_backend,
        c.normalize_attention_backend,
    ):
        assert normalize("AUTO") == "auto"


def test_torch_dtype_objects_are_accepted() -> None:
    torch = pytest.importorskip("torch")
    assert c.normalize_dtype(torch.bfloat16) == "bfloat16"


@pytest.mark.parametrize("bad", ["cutlass", "", 3, None, ["torch"]])
def test_invalid_linear_backend(bad) -> None:
    with pytest.raises(ConfigError) as info:
        c.normalize_linear_backend(bad)
    assert info.value.hint


def test_bool_and_int_text_forms() -> None:
    assert [c.normalize_bool(v) for v in ("1", "TRUE", "yes", "on", 1, True)] == [
        True
    ] * 6
    assert [c.normalize_bool(v) for v in ("0", "False", "no", "off", 0, False)] == [
        False
    ] * 6
    assert c.int_normalizer(1)("4") == 4
    with pytest.raises(ConfigError):
        c.int_normalizer(1)(2.5)
    # Lists and mappings are typed values once parsed, however they were written.
    assert sv.normalize_devices(0) == (0,) and sv.normalize_devices("0, 1") == (
        0,
        1,
    ) == sv.normalize_devices([0, 1])
    assert sv.normalize_devices("auto") == () == sv.normalize_devices("")
    assert sv.normalize_host_list("Localhost, 127.0.0.1:8000,localhost") == (
        "localhost",
        "127.0.0.1:8000",
    )
    assert sv.normalize_host_list(["a.corp", "b.corp"]) == ("a.corp", "b.corp")
    modules = sv.normalize_lora_modules("b=/x/b.safetensors, a=/x/a.safetensors")
    assert dict(modules) == {"a": "/x/a.safetensors", "b": "/x/b.safetensors"} and list(
        modules
    ) == ["a", "b"]
    assert (
        sv.normalize_lora_modules({"b": "/x/b.safetensors", "a": "/x/a.safetensors"})
        == modules
    )
