"""The load a router sees (engine/load.py): work in steps x megapixels, what is left of
running requests, per replica. Pure Python over the real Scheduler."""

from __future__ import annotations

import pytest

from diffserve.engine.load import model_load, outstanding_units, work_units
from diffserve.engine.scheduler import RequestState, Scheduler
from diffserve.types.batching import batch_key
from diffserve.types.request import GenerationRequest

MPIX = 1024 * 1024 / 1e6


def state(rid: str, **kw) -> RequestState:
    # 1.048576 megapixels.
    fields = dict(prompt="p", height=1024, width=1024, num_inference_steps=10, seed=1)
    fields.update(kw)
    return RequestState(
        GenerationRequest(request_id=rid, **fields), sink=lambda item: None
    )


def test_work_is_steps_times_megapixels_times_images_and_frames() -> None:
    assert work_units(state("a").request) == pytest.approx(10 * MPIX)
    assert work_units(state("b", height=512, width=400, n=3).request) == pytest.approx(
        10 * 512 * 400 / 1e6 * 3
    )
    assert work_units(
        state("c", num_frames=17, height=64, width=64).request
    ) == pytest.approx(10 * 64 * 64 / 1e6 * 17)


def test_a_running_request_counts_the_steps_it_has_left() -> None:
    s = Scheduler(max_batch_size=1, max_queue=10)
    s.add(state("a"))
    waiting = s.snapshot()[0][0]
    assert outstanding_units(waiting) == pytest.approx(10 * MPIX)
    [running] = s.next_batch(0, replica=1)
    assert running.replica == 1 and outstanding_units(running) == pytest.approx(
        10 * MPIX
    )
    running.steps_done = 4
    assert outstanding_units(running) == pytest.approx(6 * MPIX)
    # A batch that never reached its replica goes back whole, and to no replica.
    s.requeue([running])
    assert running.replica is None and outstanding_units(running) == pytest.approx(
        10 * MPIX
    )


def test_model_load_splits_running_work_by_replica_and_keeps_the_queue_the_models() -> (
    None
):
    s = Scheduler(max_batch_size=1, max_queue=10)
    for rid in "abcd":
        s.add(state(rid))
    [a] = s.next_batch(0, replica=0)
    [b] = s.next_batch(0, replica=1)
    a.steps_done, b.steps_done = 5, 9
    joined = s.take_joinable(batch_key(s.snapshot()[0][0].request), 1, replica=1)
    assert [j.request_id for j in joined] == ["c"]
    load = model_load(*s.snapshot(), {0: True, 1: True, 2: False})
    assert (load.queue_depth, load.running, load.in_flight) == (1, 3, 4)
    # D waits whole; a, b, c run.
    assert load.outstanding_work == pytest.approx((10 + 5 + 1 + 10) * MPIX, rel=1e-5)
    by_replica = {r.replica: r for r in load.replicas}
    assert (by_replica[0].running, by_replica[0].outstanding_work) == (
        1,
        pytest.approx(5 * MPIX, rel=1e-5),
    )
    assert (by_replica[1].running, by_replica[1].outstanding_work) == (
        2,
        pytest.approx(11 * MPIX, rel=1e-5),
    )
    assert (
        by_replica[2].live,
        by_replica[2].running,
        by_replica[2].outstanding_work,
    ) == (False, 0, 0.0)
    s.done([a, b, joined[0]])
    assert model_load(*s.snapshot(), {0: True}).outstanding_work == pytest.approx(
        10 * MPIX, rel=1e-5
    )


def test_a_load_agrees_with_itself_while_steps_advance() -> None:
    # The engine thread advances a running request's steps while a /metrics scrape sums:
    # each request's work is read once, so the model's total is always its replicas'
    # plus the queue's (an e2e scrape once saw it apart).
    class Advancing(RequestState):
        @property  # type: ignore[override]
        def steps_done(self) -> int:
            self._reads = getattr(self, "_reads", 0) + 1
            return self._reads

        @steps_done.setter
        def steps_done(self, value: int) -> None:
            pass

    s = Scheduler(max_batch_size=1, max_queue=10)
    advancing = Advancing(
        GenerationRequest(
            request_id="a",
            prompt="p",
            height=1024,
            width=1024,
            num_inference_steps=10,
            seed=1,
        ),
        sink=lambda item: None,
    )
    s.add(advancing)
    s.add(state("b"))
    s.next_batch(0, replica=0)
    load = model_load(*s.snapshot(), {0: True})
    assert load.outstanding_work == pytest.approx(
        load.replicas[0].outstanding_work + 10 * MPIX, rel=1e-6
    )
