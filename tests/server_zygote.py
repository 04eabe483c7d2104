"""Test servers forked from one process that imported the serving stack once (a zygote), not started cold.

Why: a ``diffserve serve`` process spends ~3 CPU-s importing torch, diffusers, transformers and the engine
before it reads its arguments, and the suite starts dozens of them; on the 2-core CI machine that is about a
minute of the 8-minute budget. What a test proves about a server (its HTTP API, its workers, signals, exit
codes, crashes) does not depend on how its interpreter came to have those modules imported, so each pytest
worker keeps one zygote and forks servers from it. A fork is only taken where it is the same process a cold
start would be: the same environment (up to a state directory and PYTHONPATH, which the child puts on
``sys.path`` as the interpreter would), working directory and command (``diffserve serve``); anything else (a
test that sets a variable for its server) starts cold, as before (``ServerProcess``).

The zygote is single-threaded (importing does not start torch's thread pools), so forking it is safe. The
forked server runs ``diffserve.entrypoints.cli`` as ``__main__`` exactly as ``python -m`` would (its mp workers
import it as their main module), with its output on its log and stdin on /dev/null, and it ends through the
interpreter's normal exit (atexit handlers, flushes). Its parent is the zygote, so the zygote reaps it and
reports the wait status; ``ZygoteChild`` turns that into ``subprocess.Popen``'s ``returncode``, ``poll``,
``wait``, ``send_signal`` and ``kill``. The zygote ends when its pytest worker does (EOF on its stdin) and
sends SIGTERM to the servers still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

# What a tiny-model server imports before it serves (measured with ``python -X importtime``): the rest is small.
PRELOAD = ("torch", "diffusers", "transformers", "fastapi", "uvicorn", "diffserve.entrypoints.cli",
           "diffserve.entrypoints.openai.app", "diffserve.engine.async_engine", "diffserve.executor.factory",
           "diffserve.worker.worker", "diffserve.models.flux", "diffusers.pipelines.flux")
_TESTS = str(Path(__file__).resolve().parent)
_REAP_INTERVAL_S = 0.05


# --- the zygote (its own process) ------------------------------------------------------------------------------
def serve_forever() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    _send({"ready": os.getpid()})
    running: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], _REAP_INTERVAL_S)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break  # the pytest worker is gone
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    _run_server(json.loads(line))  # never returns
                running.add(pid)
                _send({"pid": pid})
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            _send({"exit": pid, "status": status})
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _send(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _run_server(request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m diffserve.entrypoints.cli ARGS`` and end as it would."""
    code: Any = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The interpreter puts PYTHONPATH on sys.path at startup, after the script's directory: as a cold start does.
        sys.path[1:1] = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep)
                         if entry and entry not in request["zygote_pythonpath"]]
        from diffserve.entrypoints import cli

        sys.modules["__main__"] = cli  # as ``-m`` runs it: multiprocessing's children import it as their main
        sys.argv = [cli.__file__, *request["args"]]
        code = cli.main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - a crash is reported the way an uncaught exception would be
        import traceback

        traceback.print_exc()
        code = 1
    # SystemExit from here unwinds the zygote's loop and exits the interpreter normally.
    raise SystemExit(code)


# --- the pytest side ---------------------------------------------------------------------------------------------
class ZygoteChild:
    """A forked server, with the part of ``subprocess.Popen``'s interface the tests use."""

    def __init__(self, zygote: _Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self._zygote.status(self.pid, timeout=0)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = self._zygote.status(self.pid, timeout=timeout)
            if status is None:
                raise subprocess.TimeoutExpired(f"server pid {self.pid}", timeout or 0.0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygote:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.cwd = os.getcwd()
        code = f"import sys; sys.path.append({_TESTS!r}); import server_zygote; server_zygote.serve_forever()"
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=env)
        self._lock = threading.Lock()  # one fork request at a time
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._pids: list[int] = []
        assert self._proc.stdout is not None
        first = json.loads(self._proc.stdout.readline() or b'{"ready": null}')
        self.alive = first.get("ready") is not None
        threading.Thread(target=self._read, name="server-zygote", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "pid" in message:
                    self._pids.append(message["pid"])
                else:
                    self._exits[message["exit"]] = message["status"]
                self._changed.notify_all()
        with self._changed:
            self.alive = False
            self._changed.notify_all()

    def fork(self, args: list[str], log_path: Path, env: dict[str, str]) -> ZygoteChild:
        request = {"args": args, "log": str(log_path), "cwd": self.cwd, "env": env,
                   "zygote_pythonpath": self.env.get("PYTHONPATH", "").split(os.pathsep)}
        assert self._proc.stdin is not None
        with self._lock:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
            with self._changed:
                self._changed.wait_for(lambda: bool(self._pids) or not self.alive, timeout=30)
                if not self._pids:
                    raise RuntimeError("the server zygote did not fork")
                return ZygoteChild(self, self._pids.pop(0))

    def status(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or not self.alive, timeout=timeout)
            if pid not in self._exits and not self.alive and not Path(f"/proc/{pid}").exists():
                return signal.SIGKILL  # reaped by init after the zygote died: how it ended is lost
            return self._exits.get(pid)


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()
# What a server's environment may differ in from the zygote's: nothing reads them at import time (ServerProcess
# sets the state directory per server) or the child applies them as a cold start would (PYTHONPATH: a test's worker
# extension module).
_PER_SERVER_ENV = ("XDG_STATE_HOME", "PYTHONPATH")


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in _PER_SERVER_ENV}


def fork_server(args: list[str], log_path: Path, env: dict[str, str]) -> ZygoteChild | None:
    """``diffserve serve ARGS`` forked from this pytest worker's zygote, or None where a fork would not be the
    process a cold start is (another environment or working directory; set DIFFSERVE_TEST_ZYGOTE=0 to never)."""
    global _zygote
    if os.environ.get("DIFFSERVE_TEST_ZYGOTE", "1") == "0" or not args or args[0] != "serve":
        return None
    with _zygote_lock:
        if _zygote is None or not _zygote.alive:
            _zygote = _Zygote(env)
        zygote = _zygote
    if _comparable(env) != _comparable(zygote.env) or os.getcwd() != zygote.cwd or not zygote.alive:
        return None
    return zygote.fork(args, log_path, env)
