"""An engine process to kill: an mp executor (with the worker extension named by
argv[1], if any), its first worker's pid printed once it is ready, then a long sleep
until the test SIGKILLs it. The orphan-worker tests
(tests/adversarial/test_lifecycle.py, tests/executor/test_executor_semantics.py) start
it as a process of its own (``programs.start``), like a server."""

from __future__ import annotations

import sys
import time

from diffserve.config.resolve import resolve
from diffserve.executor.factory import make_executor

if __name__ == "__main__":
    config = {"distributed_executor_backend": "mp"}
    if len(sys.argv) > 1:
        config["worker_extension_cls"] = sys.argv[1]
    executor = make_executor(resolve(model=None, env={}, deploy_config=config))
    print(executor.worker_pids[0], flush=True)
    time.sleep(600)
