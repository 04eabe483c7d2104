"""Scheduler: FIFO admission, batching by compatibility key, abort, overload. Pure
Python, fast."""

from __future__ import annotations

import threading
import time

import pytest

from diffserve.engine.scheduler import RequestState, Scheduler
from diffserve.errors import EngineDeadError, EngineOverloadedError, RequestError
from diffserve.types.batching import batch_key
from diffserve.types.request import Carried, GenerationRequest


def state(rid: str, **kw) -> RequestState:
    fields = dict(prompt="p", height=128, width=128, num_inference_steps=2, seed=1)
    fields.update(kw)
    return RequestState(
        GenerationRequest(request_id=rid, **fields), sink=lambda item: None
    )


def ids(batch: list[RequestState]) -> list[str]:
    return [s.request_id for s in batch]


def test_batches_compatible_requests_up_to_max_batch_size_in_fifo_order() -> None:
    s = Scheduler(max_batch_size=3, max_queue=10)
    for rid in "abcde":
        s.add(state(rid))
    assert ids(s.next_batch(0)) == ["a", "b", "c"]
    assert ids(s.next_batch(0)) == ["d", "e"]
    assert s.next_batch(0) == []


def test_incompatible_request_does_not_block_the_head_or_lose_its_place() -> None:
    s = Scheduler(max_batch_size=4, max_queue=10)
    s.add(state("a"))
    s.add(state("big", height=256))
    s.add(state("b"))
    s.add(state("steps", num_inference_steps=4))
    s.add(state("c"))
    assert ids(s.next_batch(0)) == ["a", "b", "c"]
    assert ids(s.next_batch(0)) == ["big"]
    assert ids(s.next_batch(0)) == ["steps"]


@pytest.mark.parametrize(
    "change",
    [
        dict(guidance_scale=1.0),
        dict(max_sequence_length=32),
        dict(width=256),
        dict(num_inference_steps=3),
        dict(carried=Carried(is_warmup=True)),
    ],
)
def test_batch_key_separates_what_cannot_share_a_forward(change: dict) -> None:
    base = state("x").request
    assert batch_key(base) != batch_key(state("y", **change).request)
    # Prompt, seed and n may differ inside one batch.
    assert batch_key(base) == batch_key(state("z", prompt="other", seed=9, n=2).request)


def test_abort_queued_and_running() -> None:
    s = Scheduler(max_batch_size=1, max_queue=10)
    for rid in "abc":
        s.add(state(rid))
    running = s.next_batch(0)
    aborted, queued = s.abort("b")
    assert queued and aborted is not None and aborted.aborted
    aborted, queued = s.abort("a")
    assert not queued and aborted is running[0] and running[0].aborted
    assert s.abort("nope") == (None, False)
    s.done(running)
    assert ids(s.next_batch(0)) == ["c"]


def test_overload_duplicate_and_closed() -> None:
    s = Scheduler(max_batch_size=1, max_queue=2)
    s.add(state("a"))
    with pytest.raises(RequestError, match="already in flight"):
        s.add(state("a", prompt="x"))
    s.add(state("b"))
    with pytest.raises(EngineOverloadedError, match="max_queue=2"):
        s.add(state("c"))
    assert s.queue_depth == 2
    drained = s.drain()
    assert ids(drained) == ["a", "b"] and s.queue_depth == 0
    with pytest.raises(EngineDeadError):
        s.add(state("d"))


def test_next_batch_wakes_when_a_request_arrives() -> None:
    s = Scheduler(max_batch_size=2, max_queue=4)
    threading.Timer(0.1, lambda: s.add(state("late"))).start()
    start = time.monotonic()
    assert ids(s.next_batch(5.0)) == ["late"]
    assert time.monotonic() - start < 2.0


def test_finish_delivers_exactly_once() -> None:
    got: list = []
    st = RequestState(GenerationRequest(prompt="p", seed=1), sink=got.append)
    assert st.finish("first") and not st.finish("second")
    assert got == ["first"]
