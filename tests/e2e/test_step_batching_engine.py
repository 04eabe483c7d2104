"""Step-level batching through the engine (uni and mp): a request that arrives while a
batch of its key runs joins it at a step boundary (its first step comes before the
running request is done), each request gets its own step progress, leaves when done, and
images equal the requests alone. With ``batching: request`` the newcomer waits for the
whole batch instead."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from diffserve import Engine, GenerationRequest

pytestmark = pytest.mark.e2e

STEPS = 12


def request(seed: int, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        prompt="a red fox in snow",
        height=64,
        width=64,
        num_inference_steps=STEPS,
        guidance_scale=0.0,
        max_sequence_length=32,
        seed=seed,
        **kw,
    )


class Run:
    """One generate on a thread, recording the time of each of its progress steps and of
    its end."""

    def __init__(self, engine: Engine, req: GenerationRequest) -> None:
        self.steps: list[tuple[int, float]] = []
        self.out: Any = None
        self.done_at = 0.0
        self.thread = threading.Thread(
            target=self._run, args=(engine, req), daemon=True
        )
        self.thread.start()

    def _run(self, engine: Engine, req: GenerationRequest) -> None:
        self.out = engine.generate(
            req,
            timeout=300,
            on_progress=lambda e: self.steps.append((e.step, time.monotonic())),
        )
        self.done_at = time.monotonic()

    def wait_for_step(self, step: int) -> None:
        deadline = time.monotonic() + 120
        while not any(s >= step for s, _ in self.steps):
            assert time.monotonic() < deadline, "the running request made no progress"
            time.sleep(0.005)


@pytest.fixture(scope="module")
def alone(tiny_flux_dir) -> dict[int, np.ndarray]:
    with Engine(str(tiny_flux_dir), env={}, enforce_eager=True) as engine:
        return {
            seed: np.asarray(engine.generate(request(seed)).images[0])
            for seed in (1, 2, 3)
        }


@pytest.mark.parametrize("executor", ["uni", "mp"])
def test_a_newcomer_joins_the_running_batch(
    tiny_flux_dir, alone, executor: str
) -> None:
    with Engine(
        str(tiny_flux_dir),
        env={},
        enforce_eager=True,
        max_batch_size=4,
        batching="step",
        distributed_executor_backend=executor,
    ) as engine:
        first = Run(engine, request(1))
        first.wait_for_step(3)
        second = Run(engine, request(2))
        second.wait_for_step(1)
        third = Run(engine, request(3))
        for run in (first, second, third):
            run.thread.join(timeout=300)
    # The newcomers stepped while the first request still ran (joined), and it left
    # first.
    assert second.steps[0][1] < first.done_at and third.steps[0][1] < second.done_at
    assert first.done_at < second.done_at
    for run, seed in ((first, 1), (second, 2), (third, 3)):
        assert [s for s, _ in run.steps] == list(range(1, STEPS + 1)), seed
        assert np.array_equal(np.asarray(run.out.images[0]), alone[seed]), seed
        assert run.out.attestation["executor"] == executor


def test_request_level_batching_makes_a_newcomer_wait(tiny_flux_dir) -> None:
    with Engine(
        str(tiny_flux_dir),
        env={},
        enforce_eager=True,
        max_batch_size=4,
        batching="request",
    ) as engine:
        first = Run(engine, request(1))
        first.wait_for_step(3)
        second = Run(engine, request(2))
        first.thread.join(timeout=300)
        second.thread.join(timeout=300)
    assert second.steps[0][1] > first.done_at
