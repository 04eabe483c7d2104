"""A native family from hooks alone (``toy_native_family.py``: encode, prepare, one
velocity call, decode, and its registry entry; no loop of its own) is served by the
shared runner with everything the runner owns: CFG-parallel on two mp ranks, First-Block
Cache per CFG branch, two replicas, step-level joins, and the attestation, each equal to
the family run on one rank in the server's process."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import numpy as np
import pytest
from toy_native_family import FAMILY, build_toy_native

from diffserve import Engine, GenerationRequest
from diffserve.registry.models import MODEL_FAMILIES, register_family

pytestmark = pytest.mark.e2e

STEPS, THRESHOLD = 8, 0.1


def request(seed: int, **extra: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "prompt": "a toy scene",
        "negative_prompt": "noise",
        "height": 32,
        "width": 32,
        "num_inference_steps": STEPS,
        "guidance_scale": 3.0,
        "seed": seed,
        "cache_threshold": THRESHOLD,
        **extra,
    }
    return GenerationRequest(**fields)


def pixels(out: Any) -> np.ndarray:
    return np.stack([np.asarray(image) for image in out.images])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    register_family(FAMILY)
    yield build_toy_native(tmp_path_factory.mktemp("toy-native"))
    MODEL_FAMILIES.pop(FAMILY.class_name)


@pytest.fixture(scope="module")
def single(model_dir):
    with Engine(
        str(model_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="uni",
        cache={"backend": "fbcache", "threshold": THRESHOLD},
        max_batch_size=4,
    ) as engine:
        yield engine


def test_cfg_parallel_replicas_and_step_cache_equal_one_rank(model_dir, single) -> None:
    seeds = [3, 4, 5, 6]
    references = [single.generate(request(seed)) for seed in seeds]
    with Engine(
        str(model_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="mp",
        cfg_parallel_size=2,
        num_replicas=2,
        max_batch_size=1,
        worker_extension_cls="toy_native_family.RegisterFamily",
        cache={"backend": "fbcache", "threshold": THRESHOLD},
    ) as served:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda seed: served.generate(request(seed)), seeds))
        uncached = served.generate(request(3, cache_threshold=0.0))
    for out, reference in zip(outs, references, strict=True):
        # The same runner, the same kernels on the same shapes in the same order: bit
        # for bit.
        assert (
            np.array_equal(pixels(out), pixels(reference))
            and out.seeds == reference.seeds
        )
        att = out.attestation
        assert att["model_family"] == "ToyNativePipeline" and att["executor"] == "mp"
        assert att["parallel"] == {
            "world_size": 2,
            "cfg_parallel_size": 2,
            "ulysses_degree": 1,
        }
        # One exchange a step on each rank.
        assert att["collectives"]["all_gather"]["calls"] == 2 * STEPS
        # Each branch decided on its own rank, exactly as both branches decided on one
        # rank.
        assert att["cache"] == reference.attestation["cache"]
        assert (
            att["linear"] == reference.attestation["linear"]
            and sum(att["linear"].values()) > 0
        )
    entry = outs[0].attestation["cache"][0]
    assert (
        entry["backend"] == "fbcache"
        and entry["skipped_steps"] > 0
        and entry["negative"]["skipped_steps"] > 0
    )
    assert {out.attestation["replica"] for out in outs} == {0, 1}
    assert uncached.attestation["cache"][0]["skipped_steps"] == 0
    # The cache really skipped work.
    assert not np.array_equal(pixels(uncached), pixels(outs[0]))


def test_a_request_joins_a_running_batch_and_equals_its_run_alone(single) -> None:
    # long enough that the second request arrives mid-batch (one batch key: the same
    # steps)
    steps = 100
    alone = [
        single.generate(request(seed, num_inference_steps=steps, cache_threshold=0.0))
        for seed in (21, 22)
    ]
    progress: dict[int, list[int]] = {21: [], 22: []}
    first_done_when_second_began: list[int] = []

    def on_progress(seed: int, step: int) -> None:
        if seed == 22 and not progress[22]:
            first_done_when_second_began.append(len(progress[21]))
        progress[seed].append(step)

    def run(seed: int) -> Any:
        return single.generate(
            request(seed, num_inference_steps=steps, cache_threshold=0.0),
            on_progress=lambda event: on_progress(seed, event.step),
        )

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(run, 21)
        deadline = time.monotonic() + 60
        while len(progress[21]) < 2:
            assert time.monotonic() < deadline, "the running request made no progress"
            time.sleep(0.001)
        joined = pool.submit(run, 22)
        outs = [first.result(), joined.result()]
    # The newcomer stepped from its own step 1 while the first was still running: it
    # joined at a boundary.
    assert (
        progress[22][0] == 1
        and first_done_when_second_began[0] < steps
        and progress[21][-1] == steps
    )
    for out, reference in zip(outs, alone, strict=True):
        assert np.array_equal(pixels(out), pixels(reference))
