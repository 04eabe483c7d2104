"""Ulysses attention against single-process attention, on real gloo process groups (2
and 4 ranks).

Each world is spawned once per module (spawn costs a torch import per rank); every rank
runs all cases, compares its rows with the full-sequence reference itself and ships
small results back through a queue.
"""

from __future__ import annotations

import queue as queue_mod
import socket
import traceback
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from diffserve.layers.attention.module import Attention
from diffserve.layers.attention.registry import select_attention_backend
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.collectives import CollectiveCounters
from diffserve.layers.ulysses import (
    UlyssesAttention,
    allowed_ulysses_degrees,
    check_ulysses,
    image_shard,
    ulysses_attention,
)

WORLD_TIMEOUT_S = 60
# (batch, heads, txt_len, image tokens per rank, head_dim)
SHAPES = ((2, 4, 7, 5, 16), (1, 8, 3, 16, 8))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _full_qkv(
    shape: tuple[int, int, int, int, int], world: int, seed: int
) -> tuple[torch.Tensor, ...]:
    batch, heads, txt_len, shard, head_dim = shape
    # Same seed on every rank: identical full tensors.
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, heads, txt_len + shard * world, head_dim, generator=g)
        for _ in range(3)
    )


def _parity_cases(group: Any, rank: int, degree: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rel": {}, "exact": {}, "txt": {}}
    for name in ("sdpa", "math"):
        backend = select_attention_backend(name, "cpu", torch.float32)
        for i, shape in enumerate(SHAPES):
            q, k, v = _full_qkv(shape, degree, seed=i)
            txt_len = shape[2]
            reference = image_shard(backend.attention(q, k, v), txt_len, rank, degree)
            local = [image_shard(t, txt_len, rank, degree, dim=2) for t in (q, k, v)]
            got = ulysses_attention(
                *local, backend=backend, group=group, txt_len=txt_len
            )
            assert got.shape == reference.shape, (got.shape, reference.shape)
            out["rel"][(name, i)] = _rel(got, reference)
            out["exact"][(name, i)] = torch.equal(got, reference)
            # must be bit-identical on every rank; shipped as numpy, which pickles by
            # value (a torch tensor would travel as a shared-memory fd, fetched from the
            # rank's resource sharer after it exited)
            out["txt"][(name, i)] = got[:, :txt_len].numpy().copy()
    return out


def _count_case(group: Any, rank: int, degree: int) -> dict[str, Any]:
    txt_len = SHAPES[0][2]
    q, k, v = _full_qkv(SHAPES[0], degree, seed=0)
    local = [image_shard(t, txt_len, rank, degree, dim=2) for t in (q, k, v)]
    backend = select_attention_backend("sdpa", "cpu", torch.float32)
    counters = KernelCounters()
    # The module form counts into the wrapped Attention's KernelCounters (attention and
    # collectives).
    module = UlyssesAttention(
        Attention("double_block", backend=backend, counters=counters), group
    )
    module(*local, txt_len=txt_len)
    got = module(*local, txt_len=txt_len)
    with counters.paused():  # warmup: neither tally moves
        module(*local, txt_len=txt_len)
    # The function form takes a CollectiveCounters directly.
    direct = CollectiveCounters()
    ulysses_attention(
        *local, backend=backend, group=group, txt_len=txt_len, counters=direct
    )
    reference = image_shard(backend.attention(q, k, v), txt_len, rank, degree)
    return {
        "module": counters.collectives.snapshot(),
        "direct": direct.snapshot(),
        "kernels": counters.snapshot(),
        "rel": _rel(got, reference),
    }


def _error_case(group: Any, degree: int) -> str:
    q = torch.zeros(1, degree + 1, 3 + 2, 4)  # heads not divisible by the degree
    backend = select_attention_backend("sdpa", "cpu", torch.float32)
    try:
        ulysses_attention(q, q, q, backend=backend, group=group, txt_len=3)
    except ValueError as error:
        return str(error)
    return "no error"


def _worker(rank: int, world: int, port: int, results: Any, subgroups: bool) -> None:
    try:
        torch.set_num_threads(1)  # ranks share two cores
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=WORLD_TIMEOUT_S),
        )
        report: dict[str, Any] = {"world": _parity_cases(None, rank, world)}
        report["count"] = _count_case(None, rank, world)
        report["error"] = _error_case(None, world)
        if subgroups:
            # Ulysses groups of 2 inside a world of 4 (as under CFG x Ulysses): every
            # rank creates every group.
            pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            group = pairs[rank // 2]
            report["pair"] = _parity_cases(group, dist.get_rank(group), 2)
        results.put((rank, "ok", report))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_world(world: int, subgroups: bool = False) -> dict[int, dict[str, Any]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker, args=(r, world, port, results, subgroups), daemon=True
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    reports: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            rank, status, payload = results.get(timeout=WORLD_TIMEOUT_S + 30)
            if status == "ok":
                reports[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
                # the other ranks may now hang in a collective; the finally kills them
                break
    except queue_mod.Empty:
        errors.append(f"timed out; reports from ranks {sorted(reports)}")
    finally:
        for proc in procs:
            proc.join(timeout=10)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    assert not errors, "\n".join(errors)
    return reports


@pytest.fixture(scope="module")
def world2() -> dict[int, dict[str, Any]]:
    return _run_world(2)


@pytest.fixture(scope="module")
def world4() -> dict[int, dict[str, Any]]:
    return _run_world(4, subgroups=True)


def _assert_parity(reports: dict[int, dict[str, Any]], key: str) -> None:
    first = reports[min(reports)][key]
    for rank, report in reports.items():
        for case, rel in report[key]["rel"].items():
            assert rel <= 1e-6, (rank, case, rel)
        for case, txt in report[key]["txt"].items():
            # text rows come from one rank per head group, shipped verbatim: identical
            # everywhere
            assert np.array_equal(txt, first["txt"][case]), (rank, case)


@pytest.mark.parametrize("world", ["world2", "world4"])
def test_matches_single_process_attention(
    world: str, request: pytest.FixtureRequest
) -> None:
    reports = request.getfixturevalue(world)
    assert len(reports) == int(world[-1])
    _assert_parity(reports, "world")


def test_subgroups_inside_a_larger_world(world4: dict[int, dict[str, Any]]) -> None:
    _assert_parity(world4, "pair")


@pytest.mark.parametrize("world", ["world2", "world4"])
def test_collectives_and_attention_are_counted(
    world: str, request: pytest.FixtureRequest
) -> None:
    reports = request.getfixturevalue(world)
    batch, heads, txt_len, shard, head_dim = SHAPES[0]
    # Stacked image Q/K/V shards, float32.
    forward = 3 * batch * heads * shard * head_dim * 4
    # Text rows ride along for every head group.
    back = batch * (txt_len + shard) * heads * head_dim * 4
    for report in reports.values():
        count = report["count"]
        assert count["rel"] <= 1e-6
        assert count["module"] == {
            "all_to_all": {"calls": 4, "bytes": 2 * (forward + back)}
        }
        assert count["direct"] == {"all_to_all": {"calls": 2, "bytes": forward + back}}
        assert count["kernels"]["attention"] == {"sdpa": 2}


@pytest.mark.parametrize("world", ["world2", "world4"])
def test_heads_not_divisible_raise_before_any_collective(
    world: str, request: pytest.FixtureRequest
) -> None:
    degree = int(world[-1])
    for report in request.getfixturevalue(world).values():
        assert f"num_heads={degree + 1} is not divisible" in report["error"]
        assert "allowed degrees: 1" in report["error"]


def test_check_ulysses_names_allowed_degrees() -> None:
    assert check_ulysses(24, 4096, 4) is None
    assert allowed_ulysses_degrees(24, 4096) == [1, 2, 4, 8]
    message = check_ulysses(24, 1000, 16)
    assert message is not None
    assert (
        "num_heads=24 is not divisible" in message
        and "image_tokens=1000 is not divisible" in message
    )
    assert message.endswith("(allowed degrees: 1, 2, 4, 8)")
    assert "image_tokens=4095" in (check_ulysses(24, 4095, 2) or "")
    assert check_ulysses(24, 4096, 0) == "ulysses degree must be >= 1, got 0"


def test_image_shard_slices_text_and_one_image_shard() -> None:
    x = torch.arange(3 + 8)[None, :, None]  # 3 text tokens, 8 image tokens
    assert image_shard(x, 3, 1, 4).flatten().tolist() == [0, 1, 2, 5, 6]
    with pytest.raises(
        ValueError, match="image_tokens=8 is not divisible by ulysses degree 3"
    ):
        image_shard(x, 3, 0, 3)
