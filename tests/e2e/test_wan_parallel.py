"""Wan on parallel worker processes (mp, gloo on 127.0.0.1): the two CFG branches on two
ranks and Ulysses=2 over the video tokens give the single-rank video (float32 >= 60 dB;
CFG-parallel bit for bit), the attestation proves the layout and the exchanges, and a
request without CFG runs on the CFG rank 0 alone. With the step cache on (First-Block
Cache) each layout skips the steps one rank skips, per video and branch. On Ray, two
replicas share the videos, each the one-rank video bit for bit."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from diffserve import Engine, GenerationRequest

pytestmark = pytest.mark.e2e

# fbcache on: two steps never skip (the first and the last always compute), so only
# ``cached()`` requests do.
COMMON = dict(
    env={},
    dtype="float32",
    enforce_eager=True,
    linear_backend="torch",
    cache={"backend": "fbcache"},
)


def request(
    guidance: float = 5.0, seed: int = 5, steps: int = 2, **extra: Any
) -> GenerationRequest:
    return GenerationRequest(
        prompt="a ball rolling left",
        negative_prompt="blurry",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=steps,
        guidance_scale=guidance,
        seed=seed,
        **extra,
    )


def cached() -> GenerationRequest:
    return request(steps=6, cache_threshold=1.0)


def decisions(entry: dict[str, Any]) -> list[list[str]]:
    """Each CFG branch's compute/skip decisions, step by step."""
    return [
        [decision for _, _, decision in branch["trace"]]
        for branch in (entry, entry["negative"])
    ]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def one_rank(tiny_wan22_dir: Any) -> tuple[Any, Any, Any]:
    """The one-rank videos both layouts are held to: guided, without CFG, and guided
    through the step cache."""
    with Engine(
        str(tiny_wan22_dir), distributed_executor_backend="uni", **COMMON
    ) as single:
        return (
            single.generate(request()),
            single.generate(request(guidance=1.0)),
            single.generate(cached()),
        )


@pytest.mark.parametrize(
    "layout",
    [{"cfg_parallel_size": 2}, {"ulysses_degree": 2}],
    ids=["cfg2", "ulysses2"],
)
def test_parallel_ranks_match_one_rank(
    tiny_wan22_dir: Any, one_rank: tuple[Any, Any, Any], layout: dict[str, int]
) -> None:
    reference, unguided, reference_cached = one_rank
    with Engine(
        str(tiny_wan22_dir), distributed_executor_backend="mp", **layout, **COMMON
    ) as parallel:
        out = parallel.generate(request())
        alone = parallel.generate(request(guidance=1.0))  # one branch: no CFG exchange
        out_cached = parallel.generate(cached())
    assert out.attestation["parallel"]["world_size"] == 2
    assert psnr(out.videos[0], reference.videos[0]) >= 60.0
    assert (
        out.attestation["experts"]["steps"] == reference.attestation["experts"]["steps"]
    )
    att = out.attestation
    exchanged = att["collectives"]  # summed over the ranks, as the kernel counts
    if "cfg_parallel_size" in layout:
        # The same kernels on the same shapes in the same order on each branch: bit for
        # bit on CPU float32.
        assert np.array_equal(out.videos[0], reference.videos[0])
        assert exchanged["all_gather"]["calls"] == 2 * 2  # one per step on each rank
        # A branch each.
        assert [rank["transformer_forwards"] for rank in att["per_rank"]] == [2, 2]
        assert [
            rank["transformer_forwards"] for rank in alone.attestation["per_rank"]
        ] == [2, 0]
        assert "all_gather" not in alone.attestation["collectives"]
    else:
        # Two all-to-alls per self-attention call (half the attention calls:
        # cross-attention needs none) and one gather of the video tokens per forward, on
        # each rank.
        assert exchanged["all_to_all"]["calls"] == att["attention"]["sdpa"] > 0
        assert (
            exchanged["all_gather"]["calls"] == att["transformer_forwards"] == 2 * 2 * 2
        )
    assert psnr(alone.videos[0], unguided.videos[0]) >= 60.0
    # The step cache decides alike on every layout: CFG-parallel's negative branch
    # decides on its own rank (its entry attached to rank 0's), Ulysses' signal is
    # summed over the ranks' token shards.
    (entry,) = out_cached.attestation["cache"]
    (one_rank_entry,) = reference_cached.attestation["cache"]
    assert entry["skipped_steps"] > 0 and entry["negative"]["skipped_steps"] > 0, entry
    assert decisions(entry) == decisions(one_rank_entry)
    assert psnr(out_cached.videos[0], reference_cached.videos[0]) >= 60.0


def test_ray_replicas_share_the_videos(
    tiny_wan22_dir: Any, one_rank: tuple[Any, Any, Any], ray_session: Any
) -> None:
    """Wan on the Ray executor with two replicas: concurrent videos land on both, each
    the one-rank video."""
    reference = one_rank[0].videos[0]
    with (
        Engine(
            str(tiny_wan22_dir),
            distributed_executor_backend="ray",
            num_replicas=2,
            max_batch_size=1,
            **COMMON,
        ) as engine,
        ThreadPoolExecutor(2) as pool,
    ):
        # RPCs reach both, in order.
        assert [d["replica"] for d in engine.collective_rpc("describe")] == [0, 1]
        outs = list(
            pool.map(lambda seed: engine.generate(request(seed=seed)), [5, 6, 7, 8])
        )
    assert {out.attestation["replica"] for out in outs} == {0, 1}
    assert all(out.attestation.get("node") for out in outs)  # the Ray node each ran on
    assert np.array_equal(outs[0].videos[0], reference)
    assert [out.seeds for out in outs] == [[5], [6], [7], [8]]
    assert all(
        out.attestation["experts"] == outs[0].attestation["experts"] for out in outs
    )
