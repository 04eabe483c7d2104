"""The environment of a process diffserve asks Ray to start for it (a rank actor, a Ray
Serve replica).

Ray-free, so the Ray Serve front's options can use it without importing Ray.
"""

from __future__ import annotations

import os

from diffserve.tracing.settings import tracing_environment

# Ray lowers its worker processes to niceness 15 (background tasks); a rank actor or a
# Serve replica is the denoiser, the work the deployment exists for. At 15 any busy
# process at the default niceness on the node (the API server, another job) takes nearly
# all the CPU from it: measured on 2 cores beside two busy loops, a 2-replica engine
# took 207 s for 8 tiny images instead of 29 s. Ray's own job supervisor sets this too.
PRIORITY_ENV = {"RAY_worker_niceness": "0"}


def worker_env() -> dict[str, str]:
    """``runtime_env["env_vars"]`` for such a process: its priority, and this process's
    ``OTEL_*`` settings so it traces (and exports) as this one does, on whichever node
    it lands. (``env_vars`` merge with the job's runtime_env: its PYTHONPATH stays.)"""
    return {**PRIORITY_ENV, **tracing_environment(os.environ)}
