"""An mp worker process: its entry point, and how it knows that the engine that started
it is still there.

Workers are forked from a fork server (``executor/mp.py``) that imported torch,
diffusers and diffserve once, so a worker starts in milliseconds instead of re-importing
them (about 6 s on two cores). The fork server, not the engine, is then the worker's
parent, so liveness is watched on the engine's own process, through a pidfd where the OS
has one (Linux >= 5.3: readable once that process is gone, never fooled by a reused
pid). The environment is the engine's at executor start, applied before anything reads
it (the fork server's is the one it was started with).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from diffserve.logging import get_logger
from diffserve.tracing.provider import start_tracing, stop_tracing
from diffserve.worker.loop import serve
from diffserve.worker.worker import Worker

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig

logger = get_logger(__name__)

# How often the watchdog thread of an mp worker checks its engine (also while loading
# and inside a step).
_WATCHDOG_S = 0.5


def process_main(
    conn: Connection,
    config: ResolvedConfig,
    stage_id: int,
    rank: int,
    parent_pid: int,
    log_level: int | None = None,
    replica: int = 0,
    init_method: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Entry point of an mp worker process.

    No PR_SET_PDEATHSIG: Linux ties it to the parent *thread*, so a worker started from
    a short-lived thread would be killed with it. The loop checks ``parent_pid`` (idle
    and between steps) and a closed pipe ends the loop; a watchdog thread, started
    before the model loads, covers the rest: a load or a step that never returns.
    """
    from diffserve.types.channel import PipeChannel

    # The engine's environment now (thread counts, pins), not the fork server's.
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    # The parent logs (CLI/server): so does its worker, at the same level.
    if log_level is not None:
        from diffserve.logging import configure_logging

        configure_logging(log_level)
    # The engine's OTEL_* environment: this process exports the spans it makes
    # (tracing/provider.py).
    start_tracing("worker")
    # The parent decides when we stop; a Ctrl-C in the terminal must not kill workers
    # mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_alive = process_alive(parent_pid)
    start_parent_watchdog(parent_pid, parent_alive)
    channel = PipeChannel(conn)
    try:
        serve(
            channel,
            lambda: Worker(
                config,
                stage_id,
                rank,
                executor="mp",
                replica=replica,
                init_method=init_method,
            ),
            parent_alive=parent_alive,
        )
    finally:
        channel.close()
        # the spans this worker ended reach the collector before it exits
        stop_tracing()


def process_alive(pid: int) -> Callable[[], bool]:
    """A cheap check that process ``pid`` is still running: its pidfd, else ``kill(pid,
    0)``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda: False
    except (
        AttributeError,
        OSError,
    ):  # no pidfd on this OS: a reused pid would go unnoticed
        return lambda: _exists(pid)
    return lambda: not select.select([fd], [], [], 0)[0]


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_parent_watchdog(
    parent_pid: int, parent_alive: Callable[[], bool], interval_s: float = _WATCHDOG_S
) -> threading.Thread:
    """Exit this process (``os._exit``) as soon as the engine process ``parent_pid`` is
    gone.

    A thread, not the command loop, so it also fires while the model loads or a step
    hangs; ``os._exit`` because nothing else may run then: the main thread may be stuck,
    and there is nobody to report to.
    """

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if not parent_alive():
                logger.warning(
                    "worker pid %d: parent %d is gone, exiting", os.getpid(), parent_pid
                )
                os._exit(1)

    thread = threading.Thread(
        target=watch, name="diffserve-parent-watchdog", daemon=True
    )
    thread.start()
    return thread
