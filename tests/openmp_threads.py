"""How many native threads (OpenMP pool threads among them) a process holds after two
requests on a tiny model: ``python -m openmp_threads MODEL engine`` runs them in a uni
Engine, ``... one-thread`` runs the same requests with every torch op on the main
thread. It prints the count as JSON. tests/e2e/test_one_compute_thread.py starts both as
fresh processes: no OpenMP team exists before the requests."""

from __future__ import annotations

import json
import os
import sys
import threading


def native_threads() -> int:
    """Threads of this process that Python did not start (OpenMP's, oneDNN's,
    tokenizers')."""
    python = {thread.native_id for thread in threading.enumerate()}
    return sum(1 for tid in os.listdir("/proc/self/task") if int(tid) not in python)


def main(model: str, mode: str) -> int:
    from diffserve import Engine, GenerationRequest
    from diffserve.config.resolve import resolve
    from diffserve.registry.models import MODEL_FAMILIES, read_class_name
    from diffserve.types.results import to_pil

    # 256x256: the images are above torch's parallel grain, so a copy of them would be a
    # parallel region.
    requests = [
        GenerationRequest(
            prompt="a fox",
            height=256,
            width=256,
            num_inference_steps=1,
            seed=1,
            max_sequence_length=16,
            output_type=kind,
        )
        for kind in ("pil", "pt")
    ]
    if mode == "engine":
        with Engine(model, dtype="float32", env={}) as engine:
            for request in requests:
                engine.generate(request)
            return native_threads()
    # The same requests, every torch op on this one thread.
    family = MODEL_FAMILIES[read_class_name(model)]
    cls = family.load_pipeline_class(family.implementation)
    stage = resolve(model=model, overrides={"dtype": "float32"}, env={}).stage_for_role(
        "diffusion"
    )
    pipe = cls.from_stage(model, stage)
    for request in requests:
        images = pipe(request.with_seed()).images
        if request.output_type == "pil":
            to_pil(images)
    return native_threads()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
