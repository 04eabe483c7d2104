"""Failure semantics of the sync Engine on both executors: validation before the worker,
isolation of a failing request, RPCs between batches, warmup, worker death and shutdown
without orphans."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from typing import Any

import pytest
from background import generate_in_background, kill_mid_request
from e2e_utils import pid_alive

from diffserve import Engine, GenerationRequest
from diffserve.errors import EngineDeadError, RequestError, WorkerError
from diffserve.worker.extension import WorkerExtension

pytestmark = pytest.mark.e2e


class FaultExtension(WorkerExtension):
    """Fails any batch that contains the prompt "explode" (a request the model cannot
    serve)."""

    def after_load(self, worker: Any) -> None:
        original = worker.pipeline.run

        def check(batch: list[Any]) -> list[Any]:
            if any(r.prompt == "explode" for r in batch):
                raise RuntimeError("injected failure for prompt 'explode'")
            return batch

        def run(batch: list[Any], joins: Any = None) -> Any:
            # Step-level batching: a request that joins later is checked when it joins.
            return original(
                check(batch), (lambda: check(joins())) if joins is not None else None
            )

        worker.pipeline.run = run


def request(
    prompt: str = "a fox", steps: int = 2, seed: int = 42, **kw: Any
) -> GenerationRequest:
    fields = dict(height=128, width=128, guidance_scale=0.0, max_sequence_length=64)
    fields.update(kw)
    return GenerationRequest(
        prompt=prompt, num_inference_steps=steps, seed=seed, **fields
    )


def deploy(executor: str, **extra: Any) -> dict[str, Any]:
    return {
        "dtype": "float32",
        "enforce_eager": True,
        "distributed_executor_backend": executor,
        "worker_extension_cls": f"{FaultExtension.__module__}.FaultExtension",
        **extra,
    }


def start_long(
    engine: Engine, steps: int = 100, **kw: Any
) -> tuple[threading.Thread, dict[str, Any]]:
    """Run a long request on a thread; returns once its first denoise step is done."""
    first = threading.Event()
    thread, box = generate_in_background(
        engine, request(steps=steps, seed=7, **kw), started=first
    )
    assert first.wait(120)
    return thread, box


@pytest.fixture(scope="module", params=["uni", "mp"])
def engine(request: Any, tiny_flux_dir: Any) -> Any:
    eng = Engine(
        str(tiny_flux_dir),
        deploy_config=deploy(request.param),
        env={},
        max_batch_size=4,
        warmup={"enabled": True, "steps": 1},
    )
    yield eng
    eng.shutdown()


def test_keywords_reach_resolve_and_warmup_is_excluded(engine: Engine) -> None:
    stage = engine.config.stage_for_role("diffusion")
    assert stage.max_batch_size == 4 and stage.warmup.enabled
    assert engine.config.provenance["stages.0.max_batch_size"].layer != "yaml"
    assert (
        engine.is_ready
        and engine.stats()["batches"] == 0
        and engine.stats()["requests_ok"] == 0
    )
    # The warmup did run.
    assert engine.collective_rpc("describe")[0]["batches_run"] == 1
    # ... with the counters paused by the worker (the one place warmup is handled).
    assert engine.collective_rpc("kernel_counters")[0]["transformer_forwards"] == 0
    out = engine.generate(request())
    # Warmup calls never leak into a request.
    assert out.attestation["transformer_forwards"] == 2
    assert engine.stats()["batches"] == 1


@pytest.mark.parametrize(
    "bad, param",
    [
        (dict(n=5), "n"),  # server.max_n defaults to 4
        (dict(height=2048, width=2048), "size"),  # over server.max_pixels
        (dict(steps=101), "num_inference_steps"),  # over server.max_steps
        (dict(height=130), "height"),  # not a multiple of 16
        (dict(prompt=" "), "prompt"),
        (dict(max_sequence_length=0), "max_sequence_length"),
    ],
)
def test_bad_requests_are_rejected_before_a_worker(
    engine: Engine, bad: dict, param: str
) -> None:
    before = engine.collective_rpc("describe")[0]["batches_run"]
    with pytest.raises(RequestError) as info:
        engine.generate(request(**bad))
    assert info.value.param == param
    assert engine.collective_rpc("describe")[0]["batches_run"] == before


def test_one_failing_request_does_not_take_others_down(engine: Engine) -> None:
    long_thread, _ = start_long(engine, steps=12)
    results: dict[str, Any] = {}

    def run(prompt: str, seed: int) -> None:
        try:
            results[prompt] = engine.generate(request(prompt=prompt, seed=seed))
        except BaseException as exc:  # noqa: BLE001
            results[prompt] = exc

    # Queued behind the long request, these three share a batch key and are batched
    # together.
    threads = [
        threading.Thread(target=run, args=(p, s))
        for p, s in (("ok one", 1), ("explode", 2), ("ok two", 3))
    ]
    for t in threads:
        t.start()
    for t in [long_thread, *threads]:
        t.join(120)
    assert isinstance(results["explode"], WorkerError)
    assert results["explode"].remote_type == "RuntimeError" and "injected" in str(
        results["explode"]
    )
    assert results["ok one"].seeds == [1] and results["ok two"].seeds == [3]
    assert not engine.is_dead
    engine.check_health()
    assert len(engine.generate(request()).images) == 1


def test_rpc_runs_between_batches_never_during_one(engine: Engine) -> None:
    before = engine.collective_rpc("describe")[0]["batches_run"]
    thread, box = start_long(engine, steps=12)
    info = engine.collective_rpc("describe")[0]  # sent while the batch runs
    returned_at = time.monotonic()
    thread.join(120)
    assert "out" in box, box
    # It waited for the running batch to finish.
    assert info["batches_run"] == before + 1
    assert box["done_at"] <= returned_at + 1.0


def test_mp_worker_sigkill_fails_fast_and_leaves_no_child(tiny_flux_dir: Any) -> None:
    engine = Engine(str(tiny_flux_dir), deploy_config=deploy("mp"), env={})
    (pid,) = engine.worker_pids
    assert pid != os.getpid() and pid_alive(pid)
    kill_mid_request(engine, request(steps=100, seed=7), pid)
    assert engine.is_dead and not engine.is_ready
    with pytest.raises(EngineDeadError):
        engine.generate(request())
    with pytest.raises(EngineDeadError):
        engine.check_health()
    start = time.monotonic()
    engine.shutdown()
    engine.shutdown()  # idempotent
    assert time.monotonic() - start < 15
    assert not pid_alive(pid)
    assert pid not in [p.pid for p in multiprocessing.active_children()]


def test_context_manager_shuts_down(tiny_flux_dir: Any) -> None:
    # uni only: mp shutdown (and no orphans) is covered above and in tests/engine with
    # model-less workers.
    with Engine(str(tiny_flux_dir), deploy_config=deploy("uni"), env={}) as engine:
        assert engine.collective_rpc("ping") == ["pong"]
    assert not engine.is_ready
    with pytest.raises(EngineDeadError):
        engine.generate(request())


def test_n_images_report_their_seeds_and_reproduce_alone(engine: Engine) -> None:
    out = engine.generate(request(seed=11, n=2))
    assert out.seeds == [11, 12] and len(out.images) == 2
    assert all(image.size == (128, 128) for image in out.images)
    alone = engine.generate(request(seed=12))
    assert alone.images[0].tobytes() == out.images[1].tobytes()
    # No seed given: the engine picks one and reports it, so the image can be made
    # again.
    picked = engine.generate(request(seed=None))
    assert picked.seeds and picked.seeds[0] is not None
    again = engine.generate(request(seed=picked.seeds[0]))
    assert again.images[0].tobytes() == picked.images[0].tobytes()


def test_generate_timeout_aborts_the_request(engine: Engine) -> None:
    req = request(steps=100, seed=21)
    with pytest.raises(TimeoutError):
        engine.generate(req, timeout=0.15)
    # The slot was freed: the next request runs.
    assert engine.generate(request()).seeds == [42]
    cancelled = engine.collective_rpc("describe")[0]["cancelled"]
    assert any(
        req.request_id in c["request_ids"] and c["steps_done"] < 100 for c in cancelled
    )
    assert engine.num_running == 0 and engine.queue_depth == 0
