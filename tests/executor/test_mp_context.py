"""Which process start the mp executor uses: CPU workers fork from the preloaded fork server; CUDA workers are
spawned (on an H200 every forked CUDA worker failed "Cannot re-initialize CUDA in forked subprocess": a
preloaded library had touched CUDA; tests/e2e/test_cuda_replicas_gpu.py covers the real thing on a GPU)."""

from __future__ import annotations

import multiprocessing

from diffserve.executor.mp import FORKSERVER_PRELOAD, worker_context


def test_cpu_workers_fork_from_the_preloaded_server_and_cuda_workers_spawn() -> None:
    cpu = worker_context(on_cuda=False)
    expected = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    assert cpu.get_start_method() == expected
    assert "torch" in FORKSERVER_PRELOAD
    assert worker_context(on_cuda=True).get_start_method() == "spawn"
