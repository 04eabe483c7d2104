"""One vLLM engine of an AR stage replica: vLLM's own ``LLMEngine``, driven step by step
by one thread.

``uni`` runs vLLM's engine core and its worker in this process (vLLM's ``uni`` executor,
no engine-core process: a start in ~3 s once vLLM is imported); ``mp`` runs the engine
core in its own process and one worker process per rank (vLLM's ``mp`` executor: tensor
parallel on CPU too). Requests join the running batch whenever there is room
(``max_num_seqs``): vLLM's continuous batching, fed by the stage's queue
(``engine/ar_stage.py``).

Not thread-safe: the stage's dispatch thread owns it. vLLM's CPU worker changes its
process on start (it replaces ``torch.set_num_threads`` with a no-op and may pin
threads); in ``uni`` that process is the server's, so the start puts both back for the
diffusion stages that share it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from diffserve.ar.chat import chat_messages
from diffserve.config.ar_schema import ArStageConfig
from diffserve.config.vllm_args import vllm_version
from diffserve.errors import RequestError
from diffserve.logging import get_logger

logger = get_logger(__name__)

PROBE = "diffserve.ar.probe.AttestationProbe"
WARMUP_ID = "diffserve-warmup"
WARMUP_PROMPT = "warm up"
# vLLM reads these at start from the environment (its envs module): set for the start
# only, one start at a time.
_START_LOCK = threading.Lock()
# In-process (uni) engines alive in this process: vLLM keeps its parallel state (world,
# TP and expert groups) per process, so a second in-process engine shares the first
# one's (two dense models do; a MoE after a dense one finds no expert group). A failed
# start says so.
_IN_PROCESS: set[int] = set()


@dataclass
class ArOutput:
    """One finished request: the text drawn and what it cost."""

    request_id: str
    text: str
    prompt_token_ids: list[int]
    output_tokens: int
    cached_tokens: int
    finish_reason: str | None
    first_token_ms: float | None
    total_ms: float


@dataclass
class _Running:
    started: float
    first_token: float | None = None


@dataclass
class VllmEngine:
    """An AR stage's vLLM engine: ``start``, then ``add`` / ``step`` / ``abort`` from
    one thread."""

    stage: ArStageConfig
    # Prefill/decode: the connector's extra config.
    kv_connector_config: Mapping[str, Any] | None = None
    engine: Any = None
    tokenizer: Any = None
    attestation: list[dict[str, Any]] = field(default_factory=list)
    running: dict[str, _Running] = field(default_factory=dict)
    # The stage's SamplingParams, built (and so checked by vLLM) at start.
    sampling: Any = None

    def start(self) -> None:
        from vllm import EngineArgs, SamplingParams
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor

        # vLLM's own checks of the sampling defaults, before anything starts (a bad
        # combination fails the start).
        self.sampling = SamplingParams(**_thawed(self.stage.default_sampling_params))
        if self.stage.role == "prefill":
            # The prefill half only computes (and hands over) the prompt's KV.
            self.sampling.max_tokens = 1
        args = EngineArgs(**self.engine_kwargs())
        multiprocess = self.stage.executor != "uni"
        with (
            _START_LOCK,
            _vllm_start_environment(self.stage),
            _process_kept(not multiprocess),
        ):
            try:
                config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
                self.engine = LLMEngine(
                    vllm_config=config,
                    executor_class=Executor.get_class(config),
                    log_stats=False,
                    multiprocess_mode=multiprocess,
                )
            except Exception as exc:
                if not multiprocess and _IN_PROCESS and "group" in str(exc):
                    raise RuntimeError(
                        f"{exc} (another vLLM engine already runs in this process, "
                        "and vLLM keeps "
                        "its parallel state per "
                        "process: give this stage "
                        "distributed_executor_backend:"
                        " mp)"
                    ) from exc
                raise
            if not multiprocess:
                _IN_PROCESS.add(id(self))
        # VLLM's own (the one its engine detokenizes with)
        self.tokenizer = self.engine.get_tokenizer()
        self.attestation = list(self.engine.collective_rpc("diffserve_attest"))
        logger.info(
            "%s: vLLM %s engine up (%s, worker pids %s)",
            self.stage.describe(),
            vllm_version(),
            self.stage.executor,
            [a["worker_pid"] for a in self.attestation],
        )

    def engine_kwargs(self) -> dict[str, Any]:
        """The stage's vLLM settings as ``EngineArgs`` keywords, with what diffserve
        adds."""
        kwargs: dict[str, Any] = {
            key: _thawed(value) for key, value in self.stage.engine_args.items()
        }
        kwargs.update(
            model=self.stage.model, worker_extension_cls=PROBE, disable_log_stats=True
        )
        if self.kv_connector_config is not None:
            from vllm.config import KVTransferConfig

            role: Literal["kv_producer", "kv_consumer"] = (
                "kv_producer" if self.stage.role == "prefill" else "kv_consumer"
            )
            kwargs["kv_transfer_config"] = KVTransferConfig(
                kv_connector=self.stage.kv_connector,
                kv_role=role,
                kv_connector_extra_config=dict(self.kv_connector_config),
            )
        return kwargs

    def prompt_ids(self, user_prompt: str) -> list[int]:
        """The LLM's input: the deploy file's system prompt and the user's, in the
        model's chat template."""
        ids = self.tokenizer.apply_chat_template(
            chat_messages(self.stage.system_prompt, user_prompt),
            add_generation_prompt=True,
            tokenize=True,
        )
        ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        limit = int(self.engine.vllm_config.model_config.max_model_len)
        if len(ids) >= limit:
            raise RequestError(
                f"{self.stage.describe()}: the prompt is {len(ids)} "
                "tokens in the LLM's chat, at or "
                f"above its max_model_len of {limit}",
                param="prompt",
            )
        return ids

    def add(self, request_id: str, user_prompt: str) -> list[int]:
        """Queue one request in vLLM (it joins the running batch at the next step); its
        prompt's token ids."""
        ids = self.prompt_ids(user_prompt)
        self.engine.add_request(
            request_id, {"prompt_token_ids": ids}, self.sampling.clone()
        )
        self.running[request_id] = _Running(time.monotonic())
        return ids

    def warm_up(self) -> list[int]:
        """Draw one short text now: vLLM's first step sets up what every later one
        reuses (on CPU with ranks, an inductor compile of its vocab-parallel embedding's
        mask: seconds, more with a cold compile cache), which the first request would
        otherwise pay. Its forward counters are reset; returns the warm-up prompt's
        token ids (a decode stage's handover drops its KV files)."""
        sampling = self.sampling.clone()
        # Two tokens (the prefill step and one decode step), or the stage's minimum.
        sampling.max_tokens = min(
            sampling.max_tokens or 2, max(2, sampling.min_tokens or 0)
        )
        ids = self.prompt_ids(WARMUP_PROMPT)
        self.engine.add_request(WARMUP_ID, {"prompt_token_ids": ids}, sampling)
        # No deadline of its own: two tokens take a bounded number of steps, and a
        # hung worker blocks ``step`` itself (vLLM's executor times that out).
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self.counts()
        return ids

    def step(self) -> list[ArOutput]:
        """One engine step; the requests that finished in it."""
        outputs = self.engine.step()
        now = time.monotonic()  # after the step: a token drawn in it exists from here
        finished = []
        for output in outputs:
            run = self.running.get(output.request_id)
            if run is None:
                continue
            completion = output.outputs[0] if output.outputs else None
            if (
                run.first_token is None
                and completion is not None
                and completion.token_ids
            ):
                run.first_token = now
            if not output.finished:
                continue
            del self.running[output.request_id]
            end = now
            finished.append(
                ArOutput(
                    request_id=output.request_id,
                    text=completion.text if completion else "",
                    prompt_token_ids=list(output.prompt_token_ids or []),
                    output_tokens=len(completion.token_ids) if completion else 0,
                    cached_tokens=int(output.num_cached_tokens or 0),
                    finish_reason=completion.finish_reason if completion else None,
                    first_token_ms=round((run.first_token - run.started) * 1000.0, 3)
                    if run.first_token
                    else None,
                    total_ms=round((end - run.started) * 1000.0, 3),
                )
            )
        return finished

    def abort(self, request_ids: list[str]) -> None:
        ids = [r for r in request_ids if r in self.running]
        if ids:
            self.engine.abort_request(ids)
            for request_id in ids:
                del self.running[request_id]

    @property
    def busy(self) -> bool:
        return bool(self.running)

    def counts(self) -> list[dict[str, int]]:
        """Per rank: the model's forward calls and tokens since the last read (reset by
        reading)."""
        return list(self.engine.collective_rpc("diffserve_counts"))

    def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        _IN_PROCESS.discard(id(self))
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.engine_core.shutdown()


def _thawed(value: Any) -> Any:
    """Frozen config data back to the dicts and lists vLLM's dataclasses expect."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


@contextlib.contextmanager
def _vllm_start_environment(stage: ArStageConfig) -> Iterator[None]:
    """vLLM's start-time switches, for this start only (its children inherit them at
    spawn): ``uni`` runs the engine core in this process (vLLM's CPU platform turns a
    uni executor into mp otherwise) and must not pin the server's threads; with several
    CPU ranks each gets its own cores."""
    values: dict[str, str] = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if stage.executor == "uni" else "1"
    }
    if stage.executor == "uni":
        values["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    elif (
        stage.tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    ):
        cores = sorted(os.sched_getaffinity(0))
        size = max(1, len(cores) // stage.tensor_parallel_size)
        groups = [
            cores[i * size : (i + 1) * size] or cores[-1:]
            for i in range(stage.tensor_parallel_size)
        ]
        values["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            ",".join(map(str, g)) for g in groups
        )
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _process_kept(in_process: bool) -> Iterator[None]:
    """Put back what vLLM's in-process CPU worker changes in this process: torch's
    thread setter and count, and the CPU affinity."""
    if not in_process:
        yield
        return
    import torch

    setter, threads, affinity = (
        torch.set_num_threads,
        torch.get_num_threads(),
        os.sched_getaffinity(0),
    )
    try:
        yield
    finally:
        torch.set_num_threads = setter
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if os.sched_getaffinity(0) != affinity:
            os.sched_setaffinity(0, affinity)
