"""Device placement of ranks and replicas (CUDA is simulated: this machine has none)."""

from __future__ import annotations

import pytest
import torch

from diffserve.config.resolve import resolve
from diffserve.worker.device import device_for


def _stage(**deploy):
    return resolve(
        model=None,
        deploy_config={"distributed_executor_backend": "mp", **deploy},
        env={},
    ).stage_for_role("diffusion")


def test_cpu_everywhere_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert device_for(_stage(), rank=0, replica=3) == "cpu"


def test_replicas_get_their_own_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    listed = _stage(devices="2,3")
    assert [device_for(listed, 0, replica) for replica in (0, 1, 2)] == [
        "cuda:2",
        "cuda:3",
        "cuda:2",
    ]
    two_ranks = _stage(parallel={"cfg_parallel_size": 2})
    # replica-major: replica 1's ranks come after replica 0's on the machine's devices
    assert [
        device_for(two_ranks, rank, replica) for replica in (0, 1) for rank in (0, 1)
    ] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
