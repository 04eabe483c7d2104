"""What a compiling worker's process does, once: ``Worker.load``'s compile-cache set-up
(``use_compile_cache``), then the same lazy per-module ``torch.compile(dynamic=True)``
as ``FluxTransformer.compile_blocks``, on a small module; it prints the cache directory
and torch's own cache counters as JSON. tests/worker/test_compile_cache.py runs it
twice, each a fresh process (every in-memory cache empty), so the second finds the
first's graphs only on disk."""

from __future__ import annotations

import json
import sys

import torch

from diffserve.config.resolve import resolve
from diffserve.worker.compile_cache import use_compile_cache


class Block(
    torch.nn.Module
):  # a user module: dynamo does not trace torch.nn's own classes as frames
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.nn.functional.gelu(self.a(x), approximate="tanh"))


def main(model: str) -> dict[str, object]:
    config = resolve(
        model=model, overrides={"enforce_eager": False, "dtype": "float32"}, env={}
    )
    directory = use_compile_cache(config, "cpu")
    block = Block()
    block.compile(dynamic=True)
    with torch.inference_mode():
        block(torch.randn(1, 5, 8))
        block(torch.randn(1, 7, 8))
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    return {
        "dir": str(directory),
        "aot": dict(counters["aot_autograd"]),
        "fx": dict(counters["inductor"]),
        "vec_isa_ok": inductor_config.cpp.vec_isa_ok,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
