"""Platform-aware defaults: what an unset ``dtype`` and ``enforce_eager`` become on this
platform.

The rule, applied to a stage's keys that no layer set (never above anything a user
wrote, platform overlays included), recorded with source ``platform-default`` and the
reason:

| platform | ``dtype`` | ``enforce_eager`` |
|---|---|---|
| cpu with AVX512-BF16 or AMX | ``bfloat16`` (native matmuls, below) | ``true`` |
| other cpu | ``float32`` (bfloat16 would run through conversions) | ``true`` |
| cuda, rocm, xpu | ``bfloat16`` | unchanged (``false``: compile) |

Native bfloat16 matmuls run about 2x float32 with AVX512-BF16, 4-8x with AMX. On CPU
``torch.compile`` costs a minute or more before the first image, and the eager
path is at parity with it on small shapes, so eager is the CPU default; ask for
``enforce_eager: false`` to compile.
"""

from __future__ import annotations

from typing import Any

from diffserve.config.platform import native_bfloat16
from diffserve.config.provenance import Source

LAYER = "platform-default"
_ACCELERATORS = ("cuda", "rocm", "xpu")


def apply_platform_defaults(
    platform: str, values: dict[str, Any], sources: dict[str, Source]
) -> None:
    """Replace the schema defaults of ``dtype`` and ``enforce_eager`` by the platform's,
    in place."""
    for key, (value, reason) in platform_defaults(platform).items():
        if sources[key].layer == "default":
            values[key], sources[key] = value, Source(LAYER, detail=reason)


def platform_defaults(platform: str) -> dict[str, tuple[Any, str]]:
    """``{key: (value, reason)}`` of the platform's defaults (empty where the schema
    default stands)."""
    if platform == "cpu":
        has_bf16, why = native_bfloat16()
        dtype = (
            ("bfloat16", f"cpu: {why}, native bfloat16 matmuls")
            if has_bf16
            else ("float32", f"cpu: {why}, bfloat16 would run through conversions")
        )
        return {
            "dtype": dtype,
            "enforce_eager": (
                True,
                "cpu: torch.compile costs a minute or more before the first image",
            ),
        }
    if platform in _ACCELERATORS:
        return {"dtype": ("bfloat16", f"{platform}: bfloat16 tensor cores")}
    return {}
