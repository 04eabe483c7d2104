"""The two things being compared, built from the same model directory and called with
the same request: ``diffusers.FluxPipeline`` (the library called directly) and
diffserve's ``Engine``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.settings import GUIDANCE_SCALE, MAX_SEQUENCE_LENGTH, PROMPT, SEED, Case


def torch_dtype(name: str) -> Any:
    import torch

    return {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[name]


def load_diffusers(path: Path, dtype: str) -> Any:
    """diffusers' FluxPipeline from the very directory diffserve loads, in ``dtype``."""
    import diffusers
    import torch

    pipe = diffusers.FluxPipeline.from_pretrained(
        str(path), torch_dtype=torch_dtype(dtype)
    )
    pipe.set_progress_bar_config(disable=True)
    # Where diffserve's engines run (they pick the GPU when torch sees one): the same
    # device for both contenders (``make gpu-check``'s mixed-traffic run).
    if torch.cuda.is_available():
        pipe.to("cuda")
    return pipe


def diffusers_call(pipe: Any, case: Case, *, batch: int = 1) -> Callable[[], list[Any]]:
    """One text-to-image call of ``batch`` images; returns the PIL images."""
    import torch

    def call() -> list[Any]:
        generator = torch.Generator("cpu").manual_seed(SEED)
        with torch.inference_mode():
            out = pipe(
                prompt=PROMPT,
                height=case.size,
                width=case.size,
                num_inference_steps=case.steps,
                guidance_scale=GUIDANCE_SCALE,
                generator=generator,
                max_sequence_length=MAX_SEQUENCE_LENGTH,
                num_images_per_prompt=batch,
            )
        return list(out.images)

    return call


def diffusers_image(pipe: Any, size: int, steps: int, seed: int) -> Any:
    """One diffusers image of ``size`` x ``size`` with ``seed`` (the same request as
    diffserve's: prompt, guidance, text length)."""
    import torch

    generator = torch.Generator("cpu").manual_seed(seed)
    with torch.inference_mode():
        out = pipe(
            prompt=PROMPT,
            height=size,
            width=size,
            num_inference_steps=steps,
            guidance_scale=GUIDANCE_SCALE,
            generator=generator,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
    return out.images[0]


def request(
    case: Case,
    *,
    seed: int = SEED,
    n: int = 1,
    max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    **extra: Any,
) -> Any:
    """The diffserve request equivalent to ``diffusers_call`` (same prompt, seed, text
    length)."""
    from diffserve import GenerationRequest

    return GenerationRequest(
        prompt=PROMPT,
        height=case.size,
        width=case.size,
        num_inference_steps=case.steps,
        guidance_scale=GUIDANCE_SCALE,
        seed=seed,
        n=n,
        max_sequence_length=max_sequence_length,
        **extra,
    )


def load_engine(path: Path, dtype: str, **overrides: Any) -> Any:
    """diffserve's Engine (uni executor unless ``distributed_executor_backend`` says
    otherwise)."""
    from diffserve import Engine

    overrides.setdefault("distributed_executor_backend", "uni")
    overrides.setdefault("enforce_eager", True)
    return Engine(str(path), dtype=dtype, **overrides)


class EngineCall:
    """One ``Engine.generate`` per call with a fresh request (a request_id is
    single-use: the engine rejects an id still in flight). Keeps the last output's
    per-phase timings for the report."""

    def __init__(self, engine: Any, case: Case, **request_kwargs: Any) -> None:
        self.engine, self.case, self.request_kwargs = engine, case, request_kwargs
        self.timings: dict[str, float] = {}

    def __call__(self) -> list[Any]:
        out = self.engine.generate(request(self.case, **self.request_kwargs))
        self.timings = dict(out.timings)
        return list(out.images)


def engine_call(engine: Any, case: Case, **request_kwargs: Any) -> EngineCall:
    return EngineCall(engine, case, **request_kwargs)


def on_worker_thread(engine: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` run on a uni engine's worker thread (an RPC between batches), returning
    its result.

    Why: with GNU OpenMP, once two threads of one process run torch's parallel regions,
    libgomp stops spinning between regions and every op of both pays a wake-up (30-50%
    on 2 cores; docs/engine.md, "One compute thread per process"). A user runs diffusers
    on one thread and diffserve's uni worker is one thread, so a comparison in one
    process runs the diffusers contender on the engine's worker thread: both then use
    the one OpenMP team, as each would alone."""
    return engine.collective_rpc(lambda worker: fn())[0]


def diffusers_on_worker(engine: Any, path: Path, dtype: str) -> Any:
    """``load_diffusers`` on the engine's worker thread (the load's parallel copies
    included)."""
    return on_worker_thread(engine, lambda: load_diffusers(path, dtype))


def diffusers_call_on_worker(
    engine: Any, pipe: Any, case: Case, *, batch: int = 1
) -> Callable[[], list[Any]]:
    """``diffusers_call`` run on the engine's worker thread."""
    call = diffusers_call(pipe, case, batch=batch)
    return lambda: on_worker_thread(engine, call)


def shutdown(engine: Any) -> None:
    """Engines own worker processes/threads; close them even when a measurement
    failed."""
    if engine is not None and hasattr(engine, "shutdown"):
        engine.shutdown()
