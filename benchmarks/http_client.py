"""The OpenAI SDK calls the HTTP measurements make, with the same request the in-process
engine gets.

The HTTP API has no max_sequence_length field, so HTTP requests run with the engine
default (512); in-process contenders compared with HTTP use that same length.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

from benchmarks.settings import GUIDANCE_SCALE, PROMPT, SEED, Case

# The default text window; both in-process and HTTP contenders use it so the comparison
# is like for like.
HTTP_MAX_SEQUENCE_LENGTH = 512


def _body(case: Case, seed: int) -> dict[str, Any]:
    return {
        "num_inference_steps": case.steps,
        "seed": seed,
        "guidance_scale": GUIDANCE_SCALE,
    }


def _decode(result: Any) -> list[Any]:
    from PIL import Image

    return [
        Image.open(io.BytesIO(base64.b64decode(d.b64_json))).convert("RGB")
        for d in result.data
    ]


def sync_call(
    base_url: str, model: str, case: Case, seed: int = SEED
) -> Callable[[], list[Any]]:
    """One blocking images.generate per call; returns the decoded PIL images."""
    from openai import OpenAI

    client = OpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=900, max_retries=0
    )

    def call() -> list[Any]:
        result = client.images.generate(
            model=model,
            prompt=PROMPT,
            size=f"{case.size}x{case.size}",
            n=1,
            response_format="b64_json",
            extra_body=_body(case, seed),
        )
        return _decode(result)

    return call


def async_client(base_url: str) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=900, max_retries=0
    )


async def async_generate(client: Any, model: str, case: Case, seed: int) -> int:
    """One awaited images.generate; returns how many images came back."""
    result = await client.images.generate(
        model=model,
        prompt=PROMPT,
        size=f"{case.size}x{case.size}",
        n=1,
        response_format="b64_json",
        extra_body=_body(case, seed),
    )
    return len(result.data)
