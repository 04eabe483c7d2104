"""The exact conditioning cache: a repeated text skips the text encoders and gives the
same image bit for bit; anything that changes the encoders' output (the window, the
text) misses; least recently used entries go first under either bound; a request may opt
out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from diffserve.models.conditioning_cache import ConditioningCache
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest


def test_lru_bounds_by_entries_and_bytes() -> None:
    row = (torch.zeros(1, 4, 8), torch.zeros(1, 8))  # 160 bytes
    cache = ConditioningCache(max_bytes=10_000, max_entries=2, identity="x")
    for text in ("a", "b"):
        cache.put(cache.key(text, 8), row)
    assert cache.get(cache.key("a", 8)) is not None  # "a" is now the most recent
    cache.put(cache.key("c", 8), row)
    assert (
        cache.get(cache.key("b", 8)) is None
        and cache.get(cache.key("a", 8)) is not None
    )
    assert (
        cache.state().entries == 2
        and cache.state().evictions_total == 1
        and cache.state().bytes == 320
    )
    small = ConditioningCache(max_bytes=400, max_entries=100, identity="x")
    for text in "abc":
        small.put(small.key(text, 8), row)
    # The third would exceed 400 bytes.
    assert small.state().entries == 2 and small.state().bytes == 320
    # Larger than the whole cache: not kept.
    small.put(small.key("big", 8), (torch.zeros(1, 100, 8),))
    assert small.get(small.key("big", 8)) is None
    assert not ConditioningCache(max_bytes=400, max_entries=0, identity="x").enabled


class EncoderCalls:
    """Counts the text encoders' forwards (the work a hit must skip)."""

    def __init__(self, pipe: FluxPipeline) -> None:
        self.calls = 0
        for module in (pipe.encoders.clip, pipe.encoders.t5):
            module.register_forward_hook(self._count)

    def _count(self, *args: Any) -> None:
        self.calls += 1


def test_a_repeated_prompt_hits_skips_the_encoders_and_gives_the_same_image(
    tiny_flux_dir: Path,
) -> None:
    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, dtype="float32")
    calls = EncoderCalls(pipe)

    def run(**fields: Any) -> Any:
        request = dict(
            prompt="a cached fox",
            height=64,
            width=64,
            num_inference_steps=2,
            seed=4,
            max_sequence_length=32,
        )
        before = calls.calls
        out = pipe(GenerationRequest(**{**request, **fields}))
        return out, calls.calls - before

    first, first_calls = run()
    second, second_calls = run()
    # CLIP and T5.
    assert first.attestation["conditioning_cache"] == "miss" and first_calls == 2
    assert second.attestation["conditioning_cache"] == "hit" and second_calls == 0
    assert torch.equal(first.images, second.images)
    assert second.attestation["conditioning_cache_state"]["entries"] == 1
    # Another window: another T5 output.
    window, window_calls = run(max_sequence_length=64)
    assert window.attestation["conditioning_cache"] == "miss" and window_calls == 2
    fresh, fresh_calls = run(conditioning_cache=False)
    assert fresh.attestation["conditioning_cache"] == "off" and fresh_calls == 2
    assert torch.equal(fresh.images, first.images)
    # True CFG encodes the negative prompt too: a hit only when both texts hit.
    cfg = dict(negative_prompt="blurry", true_cfg_scale=2.0)
    assert run(**cfg)[0].attestation["conditioning_cache"] == "miss"
    again, again_calls = run(**cfg)
    assert again.attestation["conditioning_cache"] == "hit" and again_calls == 0


def test_max_entries_zero_turns_it_off(tiny_flux_dir: Path) -> None:
    pipe = FluxPipeline.from_pretrained(
        tiny_flux_dir, dtype="float32", conditioning_cache={"max_entries": 0}
    )
    request = dict(
        prompt="a fox",
        height=64,
        width=64,
        num_inference_steps=1,
        seed=1,
        max_sequence_length=32,
    )
    outcomes = [
        pipe(GenerationRequest(**request)).attestation["conditioning_cache"]
        for _ in range(2)
    ]
    assert outcomes == ["off", "off"]


@pytest.mark.parametrize("value", ["yes", 1])
def test_the_opt_out_must_be_a_boolean(value: Any) -> None:
    from diffserve.errors import RequestError

    with pytest.raises(RequestError) as info:
        GenerationRequest(prompt="a fox", conditioning_cache=value)
    assert info.value.param == "conditioning_cache"
