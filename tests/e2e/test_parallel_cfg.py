"""Parallel denoising on real worker processes (mp, gloo on 127.0.0.1; ray for CFG): the
two true-CFG branches on two ranks give the single-rank images bit for bit, Ulysses=2
and CFG=2 x Ulysses=2 within 60 dB of them (each rank's GEMMs see its token shard,
another shape), the attestation proves the layout and the exchange, a request without
true CFG is served by the CFG rank 0 ranks alone, and a rank killed mid-request takes
the whole group down (EngineDeadError, no rank left waiting in a collective)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from background import kill_mid_request, wait_gone

from diffserve import Engine, GenerationRequest
from diffserve.errors import EngineDeadError, RequestError

pytestmark = pytest.mark.e2e

STEPS = 3


def request(
    seed: int = 11, cfg: bool = True, steps: int = STEPS, n: int = 1
) -> GenerationRequest:
    extra: dict[str, Any] = (
        {"negative_prompt": "blurry, dark", "true_cfg_scale": 3.0} if cfg else {}
    )
    return GenerationRequest(
        prompt="a red fox in snow",
        height=128,
        width=128,
        num_inference_steps=steps,
        guidance_scale=0.0,
        max_sequence_length=64,
        seed=seed,
        n=n,
        **extra,
    )


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def pixels(out: Any) -> np.ndarray:
    return np.stack([np.asarray(image) for image in out.images])


@pytest.fixture(scope="module")
def single(tiny_flux_dir):
    with Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="uni",
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def cfg2(tiny_flux_dir):
    # The acceptance spelling: flat keywords, nothing else.
    engine = Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="mp",
        cfg_parallel_size=2,
    )
    yield engine
    engine.shutdown()


def test_cfg_parallel_matches_single_rank_and_attests_the_exchange(
    single, cfg2
) -> None:
    reference = single.generate(request(n=2))
    out = cfg2.generate(request(n=2))
    assert psnr(pixels(out), pixels(reference)) >= 60.0
    # Same kernels on the same shapes in the same order: on CPU float32 the images are
    # bit-identical.
    assert np.array_equal(pixels(out), pixels(reference))
    assert out.seeds == reference.seeds
    att = out.attestation
    assert att["executor"] == "mp" and att["rank"] == 0
    assert att["parallel"] == {
        "world_size": 2,
        "cfg_parallel_size": 2,
        "ulysses_degree": 1,
    }
    gathered = att["collectives"]["all_gather"]
    # One all_gather per step on each of the two ranks; each sends its branch's
    # prediction (float32).
    assert gathered["calls"] == 2 * STEPS
    # Ranks*steps * images*tokens*channels*4.
    assert gathered["bytes"] == 2 * STEPS * 2 * (64 * 64) * 4
    # Each rank ran one forward per step (the single rank ran two): the branches were
    # split.
    assert [rank["transformer_forwards"] for rank in att["per_rank"]] == [STEPS, STEPS]
    assert (
        att["transformer_forwards"]
        == reference.attestation["transformer_forwards"]
        == 2 * STEPS
    )
    assert att["linear"] == reference.attestation["linear"]


def test_a_request_without_true_cfg_runs_on_rank_0_alone(single, cfg2) -> None:
    reference = single.generate(request(cfg=False, seed=5))
    out = cfg2.generate(request(cfg=False, seed=5))
    assert np.array_equal(pixels(out), pixels(reference))
    att = out.attestation
    assert [rank["transformer_forwards"] for rank in att["per_rank"]] == [STEPS, 0]
    assert "all_gather" not in att["collectives"]


def test_killing_a_rank_mid_request_kills_the_group(cfg2) -> None:
    pids = list(cfg2.worker_pids)
    assert len(pids) == 2
    kill_mid_request(cfg2, request(steps=100), pids[1])
    # Rank 0 was inside a collective with the dead rank: it must be gone too, not left
    # waiting.
    assert wait_gone(pids, 10)
    with pytest.raises(EngineDeadError):
        cfg2.generate(request())


@pytest.mark.parametrize(
    "parallel",
    [{"ulysses_degree": 2}, {"cfg_parallel_size": 2, "ulysses_degree": 2}],
    ids=["ulysses2", "cfg2xulysses2"],
)
def test_ulysses_and_cfg_times_ulysses_match_single_rank(
    tiny_flux_dir, single, parallel: dict[str, int]
) -> None:
    world = 2 * parallel.get("cfg_parallel_size", 1)
    with Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="mp",
        **parallel,
    ) as engine:
        for cfg in (True, False):
            reference = single.generate(request(cfg=cfg, n=2))
            out = engine.generate(request(cfg=cfg, n=2))
            # Not bit for bit: every Linear of a Ulysses rank runs on its image-token
            # shard, a GEMM of another shape than the single rank's (a CPU kind may sum
            # it in another order). Measured on AVX2: equal.
            assert psnr(pixels(out), pixels(reference)) >= 60.0, (
                cfg,
                psnr(pixels(out), pixels(reference)),
            )
            att = out.attestation
            assert att["parallel"] == {
                "world_size": world,
                "cfg_parallel_size": world // 2,
                "ulysses_degree": 2,
            }
            # Two all_to_alls per attention call on every rank that runs the branch; the
            # image shards meet once per batch in one all_gather over each running
            # Ulysses group.
            assert (
                att["collectives"]["all_to_all"]["calls"]
                == 2 * att["attention"]["sdpa"]
            )
            assert att["collectives"]["all_to_all"]["calls"] > 0
            # Without true CFG only the cfg_rank 0 Ulysses group runs.
            running = world if cfg else 2
            assert (
                sum(rank["transformer_forwards"] > 0 for rank in att["per_rank"])
                == running
            )
        # A side of 16*odd splits unevenly.
        with pytest.raises(RequestError, match="multiple of 32"):
            engine.generate(
                GenerationRequest(
                    prompt="x",
                    height=144,
                    width=128,
                    num_inference_steps=1,
                    guidance_scale=0.0,
                    max_sequence_length=64,
                    seed=1,
                )
            )


def test_ray_runs_cfg_parallel_and_a_killed_actor_takes_the_group_down(
    tiny_flux_dir, single, ray_session
) -> None:
    # The rendezvous is rank 0's node IP and a port free there (a task on bundle 0).
    engine = Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="ray",
        cfg_parallel_size=2,
    )
    try:
        out = engine.generate(request())
        assert psnr(pixels(out), pixels(single.generate(request()))) >= 60.0
        assert out.attestation["executor"] == "ray"
        assert out.attestation["collectives"]["all_gather"]["calls"] == 2 * STEPS
        pids = list(engine.worker_pids)
        kill_mid_request(engine, request(steps=100), pids[1], within_s=30)
        assert wait_gone(pids, 15)
    finally:
        engine.shutdown()


def test_a_ulysses_degree_that_does_not_divide_the_heads_names_the_allowed_ones(
    tiny_flux_dir,
) -> None:
    from diffserve.errors import ConfigError

    # The tiny model has 4 attention heads: 3 cannot shard them.
    with pytest.raises(
        ConfigError,
        match=r"ulysses_degree 3 must divide .* 4 attention heads.*use one of 1, 2, 4",
    ):
        Engine(
            str(tiny_flux_dir),
            distributed_executor_backend="mp",
            ulysses_degree=3,
            enforce_eager=True,
            dtype="float32",
            env={},
        )


def test_cfg_parallel_replicas_serve_together_and_match_single_rank(
    tiny_flux_dir, single
) -> None:
    # The combination users meet: two replicas, each a CFG-parallel group of two ranks
    # (4 processes).
    import concurrent.futures

    with Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="mp",
        cfg_parallel_size=2,
        num_replicas=2,
    ) as engine:
        assert len(engine.worker_pids) == 4
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(
                pool.map(
                    lambda seed: engine.generate(request(seed=seed), timeout=180),
                    range(40, 44),
                )
            )
    assert {out.attestation["replica"] for out in outs} == {0, 1}
    for seed, out in zip(range(40, 44), outs, strict=True):
        assert out.attestation["parallel"]["world_size"] == 2
        assert out.attestation["collectives"]["all_gather"]["calls"] > 0
        assert psnr(pixels(out), pixels(single.generate(request(seed=seed)))) == float(
            "inf"
        )
