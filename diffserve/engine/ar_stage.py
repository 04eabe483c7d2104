"""An AR stage in the engine: its vLLM engine replicas (``ar/vllm_engine.py``), its
queue, one dispatch thread per replica, and the hand-on of each request to the next
stage with the prompt the LLM drew.

A request that asks for a rewrite waits here before the diffusion stages
(``EngineCore.submit``); each replica's thread feeds vLLM from the queue whenever it has
room (continuous batching up to ``max_num_seqs``), steps it, and passes every finished
request on: a ``prompt_rewrite`` or ``decode`` stage replaces the request's prompt with
the text drawn, a ``prefill`` stage leaves it (its KV is handed over to the decode stage
through the connector).

Faults stay in the stage: a replica whose vLLM engine raises (a killed worker) is out,
its requests fail with 503 naming the stage; with no replica left the stage is down and
requests that ask for a rewrite get 503 at once, while requests that opt out keep being
served. A request past the stage's ``timeout_s`` fails with 503 even if its engine hangs
(a watchdog thread), and vLLM drops it at the next step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from diffserve.ar.chat import revised_text
from diffserve.ar.kv_handover import KvHandover
from diffserve.ar.vllm_engine import ArOutput, VllmEngine
from diffserve.engine.ar_replica import ArReplica
from diffserve.engine.scheduler import RequestState, Scheduler
from diffserve.engine.stage_loop import QueuedStage
from diffserve.errors import ModelLoadError, RequestError, StageUnavailableError
from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from diffserve.config.ar_schema import ArStageConfig
    from diffserve.config.resolved import ResolvedConfig

logger = get_logger(__name__)


class ArHost(Protocol):
    @property
    def stopping(self) -> threading.Event: ...


class ArStage(QueuedStage):
    def __init__(
        self,
        host: ArHost,
        config: ResolvedConfig,
        stage: ArStageConfig,
        handover: KvHandover | None,
        hand_on: Callable[[RequestState], None],
    ) -> None:
        self.host = host
        self.config = config
        self.stage = stage
        self.handover = handover
        self.hand_on = hand_on
        max_num_seqs = int(stage.engine_args.get("max_num_seqs", 8))
        self.room = max_num_seqs
        self.scheduler = Scheduler(max_num_seqs, config.server.max_queue)
        self.replicas: list[ArReplica] = []
        self.threads: list[threading.Thread] = []
        self.down: StageUnavailableError | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.stage.describe()

    def start(self) -> None:
        """Start every replica's vLLM engine (one after another: vLLM's start reads
        process-wide switches), then one dispatch thread per replica and the deadline
        watchdog."""
        extra = (
            self.handover.extra_config
            if self.handover is not None and self.stage.role != "prompt_rewrite"
            else None
        )
        for index in range(self.stage.num_replicas):
            engine = VllmEngine(self.stage, extra)
            try:
                engine.start()
                warmup_ms = self._warm(engine) if self.stage.warmup else None
            except Exception as exc:
                engine.shutdown()
                raise ModelLoadError(
                    f"{self.describe()}: vLLM could not start {self.stage.model}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self.replicas.append(ArReplica(index, engine, warmup_ms))
        for replica in self.replicas:
            self._thread(
                self._loop,
                replica,
                f"diffserve-ar{self.stage.stage_id}-replica-{replica.index}",
            )
        self._thread(self._watch, None, f"diffserve-ar{self.stage.stage_id}-watchdog")

    def _warm(self, engine: VllmEngine) -> float:
        """One warm-up rewrite (``warmup: true``), in no count; what it took (ms) is
        attested. A prefill stage starts before its decode stage, so the decode's
        warm-up loads the KV the prefill's stored, and drops those files as after a
        request."""
        started = time.monotonic()
        self._kv_loaded(engine, engine.warm_up())
        took_ms = round((time.monotonic() - started) * 1000.0, 3)
        logger.info("%s: warmed up in %.0f ms", self.describe(), took_ms)
        return took_ms

    def _kv_loaded(self, engine: VllmEngine, prompt_token_ids: list[int]) -> None:
        """A decode stage loaded this prompt's KV: the handover may drop its files."""
        if self.stage.role == "decode" and self.handover is not None:
            block_size = int(engine.attestation[0]["block_size"])
            self.handover.release(prompt_token_ids, block_size)

    def _thread(self, target: Callable[..., None], arg: Any, name: str) -> None:
        thread = threading.Thread(
            target=target,
            args=(arg,) if arg is not None else (),
            daemon=True,
            name=name,
        )
        thread.start()
        self.threads.append(thread)

    def check_up(self) -> None:
        """Raise the stage's 503 when it has no live replica (checked at submit: the
        request never queues)."""
        if self.down is not None:
            raise StageUnavailableError(str(self.down))

    # -- the dispatch loop
    # ---------------------------------------------------------------------------------

    def _loop(self, replica: ArReplica) -> None:
        engine = replica.engine
        while not self.host.stopping.is_set() and replica.out is None:
            self._drop_finished(replica)
            room = self.room - len(engine.running)
            batch = (
                self.scheduler.next_any(
                    room, timeout=0 if engine.busy else 0.5, replica=replica.index
                )
                if room > 0
                else []
            )
            for state in batch:
                if replica.out is None:
                    self._add(replica, state)
                else:  # its engine died while it took this batch
                    self._fail(state, replica.out)
            if replica.out is not None:
                return
            if not engine.busy:
                continue
            try:
                outputs = engine.step()
                counts = engine.counts() if not engine.busy else None
            except Exception as exc:  # noqa: BLE001 - vLLM's engine is gone (a killed worker): the replica is out
                self._replica_lost(replica, exc)
                return
            replica.finished_since_count += len(outputs)
            for output in outputs:
                self._finished(
                    replica, output, counts if output is outputs[-1] else None
                )

    def _add(self, replica: ArReplica, state: RequestState) -> None:
        if state.finished or state.aborted:
            self.scheduler.done([state])
            return
        try:
            ids = replica.engine.add(state.request_id, state.request.prompt)
        except RequestError as exc:
            self._fail(state, exc)
            return
        except (
            ValueError,
            TypeError,
        ) as exc:  # vLLM's own checks of this request's input refused it
            self._fail(state, RequestError(f"{self.describe()}: {exc}", param="prompt"))
            return
        except Exception as exc:  # noqa: BLE001 - vLLM's engine is gone: the replica is out, this request with it
            replica.inflight[state.request_id] = (state, [])
            self._replica_lost(replica, exc)
            return
        replica.inflight[state.request_id] = (state, ids)

    def _drop_finished(self, replica: ArReplica) -> None:
        """Requests that ended meanwhile (aborted, past the deadline) leave vLLM at this
        step."""
        gone = [
            rid
            for rid, (state, _) in replica.inflight.items()
            if state.finished or state.aborted
        ]
        if gone:
            replica.engine.abort(gone)
            for rid in gone:
                state, _ = replica.inflight.pop(rid)
                self.scheduler.done([state])

    def _finished(
        self, replica: ArReplica, output: ArOutput, counts: list[dict[str, int]] | None
    ) -> None:
        state, ids = replica.inflight.pop(output.request_id, (None, []))
        if state is None:
            return
        self.scheduler.done([state])
        self._kv_loaded(replica.engine, ids)
        if state.finished:
            return
        entry = replica.entry(self.stage, self.config.fingerprint, output)
        if counts is not None:
            entry["worker_counts"] = {
                "ranks": counts,
                "requests": replica.finished_since_count,
            }
            replica.finished_since_count = 0
        state.ar.append(entry)
        state.stage_timings_ms[f"ar_stage_{self.stage.stage_id}"] = output.total_ms
        if self.stage.role != "prefill":
            revised = revised_text(output.text)
            if not revised:
                self._fail(
                    state,
                    StageUnavailableError(
                        f"{self.describe()} drew an empty prompt "
                        f"({output.finish_reason}); retry, or send rewrite_prompt: "
                        "false"
                    ),
                )
                return
            if state.original_prompt is None:
                state.original_prompt = state.request.prompt
            state.request = replace(state.request, prompt=revised)
            state.revised_prompt = revised
        try:
            self.hand_on(state)
        except Exception as exc:  # noqa: BLE001 - a full or closed next queue fails the request, not the loop
            state.finish(exc)

    # -- faults
    # ----------------------------------------------------------------------------------

    def _fail(self, state: RequestState, exc: BaseException) -> None:
        self.scheduler.done([state])
        state.finish(exc)

    def _replica_lost(self, replica: ArReplica, exc: BaseException) -> None:
        error = StageUnavailableError(
            f"{self.describe()}: its vLLM engine (replica {replica.index}) failed: "
            f"{type(exc).__name__}: {exc}"
        )
        logger.error("%s", error)
        replica.out = error
        for state, _ in list(replica.inflight.values()):
            self._fail(state, error)
        replica.inflight.clear()
        replica.engine.shutdown()
        with self._lock:
            if all(r.out is not None for r in self.replicas):
                self.down = StageUnavailableError(
                    f"{self.describe()} is down ({error}); requests that send "
                    "rewrite_prompt: false are still served"
                )
                for state in self.scheduler.drain():
                    state.finish(self.down)

    def _watch(self) -> None:
        """Fail requests past the stage's deadline, however stuck their engine is."""
        while not self.host.stopping.wait(0.25):
            now = time.monotonic()
            _, running = self.scheduler.snapshot()
            for state in running:
                if (
                    state.started is not None
                    and now - state.started > self.stage.timeout_s
                    and not state.finished
                ):
                    state.finish(
                        StageUnavailableError(
                            f"{self.describe()} did not answer within its timeout_s "
                            f"of {self.stage.timeout_s:g}s"
                        )
                    )

    # -- the engine's hooks
    # ----------------------------------------------------------------------------------

    def shutdown(self, reason: str) -> None:
        self.fail_waiting(reason)
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10.0)
        for replica in self.replicas:
            replica.engine.shutdown()
        if self.handover is not None and self.stage.role == "decode":
            self.handover.close()

    def status(self) -> dict[str, Any]:
        waiting, running = self.scheduler.snapshot()
        return {
            "stage_id": self.stage.stage_id,
            "role": self.stage.role,
            "up": self.down is None,
            "replicas_live": sum(1 for r in self.replicas if r.out is None),
            "waiting": len(waiting),
            "running": len(running),
        }


def ar_chain(
    host: ArHost, config: ResolvedConfig, entry: Callable[[RequestState], None]
) -> list[ArStage]:
    """The deployment's AR stages in order, each handing on to the next and the last to
    ``entry`` (the diffusion stages' first queue); a prefill/decode pair shares one KV
    handover."""
    stages: list[ArStage] = []
    handover: KvHandover | None = None
    for stage in reversed(config.ar_stages):
        if stage.role == "decode":
            handover = KvHandover(stage)
        nxt = stages[0].scheduler.add if stages else entry
        stages.insert(
            0,
            ArStage(
                host,
                config,
                stage,
                handover if stage.role != "prompt_rewrite" else None,
                nxt,
            ),
        )
        if stage.role == "prefill":
            handover = None
    return stages
