"""Cost-aware scheduling (engine/queues.py, engine/policy.py): deficit round robin over
shape lanes, the step-token budget, joins into a running step-level batch, reservation
and no starvation. Real requests, a real PipelineCapabilities, the real Scheduler; the
step boundaries of a running batch are simulated (``Running``). Pure Python, fast."""

from __future__ import annotations

from typing import Any

from diffserve.config.schema import StageConfig
from diffserve.config.stage_sections import RequestDefaultsConfig
from diffserve.engine.policy import schedule_policy
from diffserve.engine.scheduler import RequestState, Scheduler
from diffserve.types.batching import batch_key, step_key
from diffserve.types.capabilities import PipelineCapabilities
from diffserve.types.request import GenerationRequest

# 16 pixels a token: a default 64x64 request runs 16 tokens a step.
CAPS = PipelineCapabilities(
    family="toy",
    default_size=64,
    size_multiple=16,
    max_sequence_length=64,
    true_cfg=False,
    attention_roles=(),
    step_batching=True,
)
STEPS = 4  # the deployment's default steps


def scheduler(
    max_batch_size: int = 4, batching: str = "step", max_step_tokens: int = 0
) -> Scheduler:
    stage = StageConfig(
        max_batch_size=max_batch_size,
        batching=batching,
        max_step_tokens=max_step_tokens,
        request_defaults=RequestDefaultsConfig(num_inference_steps=STEPS),
    )
    s = Scheduler(max_batch_size, max_queue=1000)
    s.configure(schedule_policy(stage, CAPS))
    return s


def state(rid: str, size: int = 64, steps: int = STEPS, **kw: Any) -> RequestState:
    fields: dict[str, Any] = dict(
        prompt="p",
        height=size,
        width=size,
        num_inference_steps=steps,
        guidance_scale=3.5,
        max_sequence_length=32,
        seed=1,
    )
    fields.update(kw)
    return RequestState(
        GenerationRequest(request_id=rid, **fields), sink=lambda item: None
    )


def ids(batch: list[RequestState]) -> list[str]:
    return [s.request_id for s in batch]


class Running:
    """A running step-level batch on one replica: each ``boundary()`` is one denoising
    step; finished requests leave, then the scheduler fills the room (what
    ``StepJoins`` does at every step boundary)."""

    def __init__(self, s: Scheduler, batch: list[RequestState]) -> None:
        self.s, self.key = s, s.join_key(batch[0].request)
        self.left: dict[str, int] = {}
        self.live: list[RequestState] = []
        self.add(batch)

    def add(self, states: list[RequestState]) -> None:
        for st in states:
            self.left[st.request_id] = st.request.num_inference_steps or 1
            self.live.append(st)

    def tokens(self) -> int:
        return sum(CAPS.step_tokens(st.request) for st in self.live)

    def boundary(self) -> list[RequestState]:
        for st in self.live:
            self.left[st.request_id] -= 1
        done = [st for st in self.live if self.left[st.request_id] == 0]
        self.live = [st for st in self.live if self.left[st.request_id] > 0]
        self.s.done(done)
        room, tokens = self.s.join_room(st.request for st in self.live)
        joined = self.s.take_joinable(self.key, room, 0, tokens=tokens)
        self.add(joined)
        return joined


def test_policy_resolves_the_budget_and_the_mode() -> None:
    stage = StageConfig(
        max_batch_size=4,
        request_defaults=RequestDefaultsConfig(num_inference_steps=STEPS),
    )
    auto = schedule_policy(stage, CAPS)
    # max_batch_size default requests of 64x64 (16 tokens); a turn is one such batch.
    assert (auto.step_level, auto.budget, auto.quantum) == (True, 64, 64 * STEPS)
    explicit = schedule_policy(StageConfig(max_batch_size=4, max_step_tokens=100), CAPS)
    assert explicit.budget == 100
    for stage in (
        StageConfig(max_batch_size=4, batching="request"),
        StageConfig(max_batch_size=1),
    ):
        assert not schedule_policy(stage, CAPS).step_level
    assert not schedule_policy(StageConfig(max_batch_size=4), None).step_level


def test_one_lane_is_fifo() -> None:
    s = scheduler(max_batch_size=3)
    for rid in "abcde":
        s.add(state(rid))
    assert ids(s.next_batch(0)) == ["a", "b", "c"]
    assert ids(s.next_batch(0)) == ["d", "e"]
    assert s.next_batch(0) == []


def test_drr_shares_token_steps_between_lanes_of_different_costs() -> None:
    # One request a batch. A small request costs 16 tokens x 4 steps = 64 token-steps,
    # a large one (128x128) 64 x 4 = 256; a turn earns one default batch (64): the
    # large lane saves up for four turns while the small one serves once a turn.
    s = scheduler(max_batch_size=1, batching="request")
    for i in range(12):
        s.add(state(f"S{i}"))
    for i in range(3):
        s.add(state(f"L{i}", size=128))
    order = "".join(s.next_batch(0)[0].request_id[0] for _ in range(15))
    assert order == "SSSSLSSSSLSSSSL"
    # Plain round robin would alternate S and L, giving the large lane four times the
    # small lane's compute.


def test_request_level_batches_are_one_batch_key_and_every_lane_takes_turns() -> None:
    s = scheduler(max_batch_size=4, batching="request")
    s.add(state("a"))
    s.add(state("b", steps=6))
    s.add(state("c"))
    s.add(state("d", size=128))
    s.add(state("e", steps=6))
    batches = [s.next_batch(0) for _ in range(3)]
    assert [ids(b) for b in batches] == [["a", "c"], ["b", "e"], ["d"]]
    for batch in batches:
        assert len({batch_key(st.request) for st in batch}) == 1
    assert s.next_batch(0) == []


def test_a_step_level_batch_mixes_lanes_of_one_step_key_within_the_budget() -> None:
    s = scheduler(max_batch_size=4)
    s.add(state("a"))  # 16 tokens
    s.add(state("wide", size=64, width=128))  # 32 tokens, another lane
    s.add(state("other", guidance_scale=1.0))  # another step_key
    s.add(state("c", steps=8))  # the first lane: steps may differ
    batch = s.next_batch(0)
    assert sorted(ids(batch)) == ["a", "c", "wide"]
    assert len({step_key(st.request) for st in batch}) == 1
    assert sum(CAPS.step_tokens(st.request) for st in batch) == 64  # the budget
    s.add(state("d"))
    assert s.take_joinable(s.join_key(batch[0].request), 1, tokens=0) == []


def test_the_budget_caps_joins() -> None:
    s = scheduler(max_batch_size=8, max_step_tokens=64)
    s.add(state("a"))
    run = Running(s, s.next_batch(0))
    for i in range(6):
        s.add(state(f"s{i}"))
    room, tokens = s.join_room(st.request for st in run.live)
    assert (room, tokens) == (7, 48)
    joined = s.take_joinable(run.key, room, 0, tokens=tokens)
    assert ids(joined) == ["s0", "s1", "s2"]  # 16 + 3 x 16 = 64: full
    run.add(joined)
    assert s.join_room(st.request for st in run.live) == (4, 0)
    assert s.take_joinable(run.key, 4, 0, tokens=0) == []
    assert s.schedule_load().joins == 3


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    s = scheduler(max_batch_size=4)  # budget 64 tokens
    s.add(state("big", size=256))  # 256 tokens a step
    s.add(state("s0"))
    s.add(state("s1"))
    batches = []
    while batch := s.next_batch(0):
        batches.append(ids(batch))
        if "big" in ids(batch):
            # A batch already above the budget takes no joins, whatever its count room.
            s.add(state("late"))
            room, tokens = s.join_room(st.request for st in batch)
            assert (room, tokens) == (3, 64 - 256)
            key = s.join_key(batch[0].request)
            assert s.take_joinable(key, room, tokens=tokens) == []
        s.done(batch)
    assert ["big"] in batches
    assert sorted(r for b in batches for r in b) == ["big", "late", "s0", "s1"]


def test_an_oldest_request_of_another_step_key_stops_joins_and_goes_next() -> None:
    s = scheduler(max_batch_size=4)
    s.add(state("a", steps=8))
    run = Running(s, s.next_batch(0))
    s.add(state("other", guidance_scale=1.0))
    s.add(state("same"))
    for _ in range(3):
        assert run.boundary() == []  # "same" may not pass the older "other"
    while run.live:
        run.boundary()
    assert ids(s.next_batch(0)) == ["other"]
    # Once nothing older of another key waits, joins resume.
    assert ids(s.next_batch(0)) == ["same"]


def test_a_large_request_is_not_starved_by_a_stream_of_small_joins() -> None:
    s = scheduler(max_batch_size=4)  # budget 64 tokens: four small requests
    for i in range(4):
        s.add(state(f"s{i}", steps=2 + i % 3))
    run = Running(s, s.next_batch(0))
    # 96x96: 36 tokens, room for it only once at most one small request runs.
    s.add(state("large", size=96))
    joined_at = None
    for boundary in range(1, 60):
        # Small requests keep arriving faster than they finish: without reservation
        # every freed token would go to one of them.
        for j in range(2):
            s.add(state(f"n{boundary}-{j}", steps=2 + (boundary + j) % 3))
        joined = run.boundary()
        assert run.tokens() <= 64 and len(run.live) <= 4
        if "large" in ids(joined):
            joined_at = boundary
            break
    # Its lane's turn comes within a round, and from then on no small request takes the
    # room it waits for: the running ones (5 steps at most) free it.
    assert joined_at is not None and joined_at <= 8, joined_at


def test_requests_put_back_go_first_and_schedule_load_reports_lanes() -> None:
    s = scheduler(max_batch_size=2)
    for rid in ("a", "b", "c"):
        s.add(state(rid))
    s.add(state("v", size=96))
    first = s.next_batch(0, replica=0)
    assert ids(first) == ["a", "b"]
    running = s.schedule_load()
    assert (running.max_step_tokens, running.max_batch_size) == (32, 2)
    assert running.step_tokens_running == 32
    lanes = {lane.lane: lane for lane in running.lanes}
    assert (lanes["64x64"].waiting, lanes["64x64"].token_steps) == (1, 16 * STEPS)
    assert (lanes["96x96"].waiting, lanes["96x96"].token_steps) == (1, 36 * STEPS)
    assert lanes["64x64"].oldest_wait_s >= 0.0
    s.requeue(first)  # its replica was lost before it ran
    assert ids(s.snapshot()[0])[:2] == ["a", "b"]
    assert ids(s.next_batch(0)) == ["a", "b"]
    assert s.abort("c")[1] and s.schedule_load().step_tokens_running == 32
