"""Wan on parallel worker processes (mp, gloo on 127.0.0.1): the two CFG branches on two ranks and Ulysses=2
over the video tokens give the single-rank video (float32 >= 60 dB; CFG-parallel bit for bit), the attestation
proves the layout and the exchanges, and a request without CFG runs on the CFG rank 0 alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from diffserve import Engine, GenerationRequest

pytestmark = pytest.mark.e2e

COMMON = dict(env={}, dtype="float32", enforce_eager=True, linear_backend="torch")


def request(guidance: float = 5.0, seed: int = 5) -> GenerationRequest:
    return GenerationRequest(prompt="a ball rolling left", negative_prompt="blurry", height=64, width=64,
                             num_frames=9, num_inference_steps=2, guidance_scale=guidance, seed=seed)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="module")
def one_rank(tiny_wan22_dir: Any) -> tuple[Any, Any]:
    """The one-rank videos both layouts are held to: guided, and without CFG."""
    with Engine(str(tiny_wan22_dir), distributed_executor_backend="uni", **COMMON) as single:
        return single.generate(request()), single.generate(request(guidance=1.0))


@pytest.mark.parametrize("layout", [{"cfg_parallel_size": 2}, {"ulysses_degree": 2}], ids=["cfg2", "ulysses2"])
def test_parallel_ranks_match_one_rank(tiny_wan22_dir: Any, one_rank: tuple[Any, Any],
                                       layout: dict[str, int]) -> None:
    reference, unguided = one_rank
    with Engine(str(tiny_wan22_dir), distributed_executor_backend="mp", **layout, **COMMON) as parallel:
        out = parallel.generate(request())
        alone = parallel.generate(request(guidance=1.0))  # one branch: no CFG exchange
    assert out.attestation["parallel"]["world_size"] == 2
    assert psnr(out.videos[0], reference.videos[0]) >= 60.0
    assert out.attestation["experts"]["steps"] == reference.attestation["experts"]["steps"]
    att = out.attestation
    exchanged = att["collectives"]  # summed over the ranks, as the kernel counts
    if "cfg_parallel_size" in layout:
        # The same kernels on the same shapes in the same order on each branch: bit for bit on CPU float32.
        assert np.array_equal(out.videos[0], reference.videos[0])
        assert exchanged["all_gather"]["calls"] == 2 * 2  # one per step on each rank
        assert [rank["transformer_forwards"] for rank in att["per_rank"]] == [2, 2]  # a branch each
        assert [rank["transformer_forwards"] for rank in alone.attestation["per_rank"]] == [2, 0]
        assert "all_gather" not in alone.attestation["collectives"]
    else:
        # Two all-to-alls per self-attention call (half the attention calls: cross-attention needs none) and one
        # gather of the video tokens per forward, on each rank.
        assert exchanged["all_to_all"]["calls"] == att["attention"]["sdpa"] > 0
        assert exchanged["all_gather"]["calls"] == att["transformer_forwards"] == 2 * 2 * 2
    assert psnr(alone.videos[0], unguided.videos[0]) >= 60.0
