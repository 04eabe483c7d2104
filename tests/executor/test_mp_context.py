"""Which process start the mp executor uses: CPU workers fork from the preloaded fork
server; CUDA workers are spawned (on an H200 every forked CUDA worker failed "Cannot
re-initialize CUDA in forked subprocess": a preloaded library had touched CUDA;
tests/e2e/test_cuda_replicas_gpu.py covers the real thing on a GPU)."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
from typing import Any

import pytest

from diffserve.executor.mp import FORKSERVER_PRELOAD, worker_context


def test_cpu_workers_fork_from_the_preloaded_server_and_cuda_workers_spawn() -> None:
    cpu = worker_context(on_cuda=False)
    expected = (
        "forkserver"
        if "forkserver" in multiprocessing.get_all_start_methods()
        else "spawn"
    )
    assert cpu.get_start_method() == expected
    assert "torch" in FORKSERVER_PRELOAD
    assert worker_context(on_cuda=True).get_start_method() == "spawn"


def _model_code_a_load_imports(model: str, queue: Any) -> None:
    """In a worker process: the transformers, diffusers and torch modules that loading
    ``model`` imports."""
    from diffserve.config.resolve import resolve
    from diffserve.models.flux.pipeline import FluxPipeline

    stage = resolve(model=model, overrides={"dtype": "float32"}, env={}).stage_for_role(
        "diffusion"
    )
    before = set(sys.modules)
    FluxPipeline.from_stage(model, stage)
    queue.put(
        sorted(
            m
            for m in set(sys.modules) - before
            if m.startswith(("transformers", "diffusers", "torch"))
        )
    )


def test_a_forked_worker_finds_the_model_code_preloaded(tiny_flux_dir: Path) -> None:
    """diffusers and transformers import their models lazily: the fork server preloads
    the model code itself, so a worker's load imports nothing heavy after the fork (it
    once re-imported ~1 CPU-s of it in every worker)."""
    ctx = worker_context(on_cuda=False)
    if ctx.get_start_method() != "forkserver":
        pytest.skip(
            "no fork server on this OS: workers are spawned and "
            "import everything themselves"
        )
    queue = ctx.Queue()
    process = ctx.Process(
        target=_model_code_a_load_imports, args=(str(tiny_flux_dir), queue)
    )
    process.start()
    try:
        imported = queue.get(timeout=120)
    finally:
        process.join(30)
    # Left to the worker: tokenizer modules (a few ms). Not the model code.
    heavy = [
        m for m in imported if "modeling" in m or m.startswith(("diffusers", "torch"))
    ]
    assert heavy == [], imported
