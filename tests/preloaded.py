"""A preloaded launcher for the tests' own ``python -m diffserve...`` processes.

Every ``diffserve serve`` a test starts used to pay ~3.5 CPU-s of imports (torch, transformers, diffusers,
fastapi) before its first line of work; the suite starts ~30 of them on a 2-core machine. The launcher is one
process per pytest process that imports all of that once and then forks each requested process from itself,
the way a fork server does: the child sets its argv, environment, working directory and output, and runs the
module as ``__main__``, so it is the same program a fresh ``python -m`` runs, minus the import time.

A fork is only as good as a fresh start where nothing imported has read the environment differently: a
request whose import-time environment (``IMPORT_TIME_ENV``: the hub, torch and thread-pool variables) differs
from the launcher's runs as a plain subprocess instead. The launcher never runs a torch op, so no OpenMP
thread pool exists when it forks (the mp executor's own fork server relies on the same rule). A PYTHONPATH
that only adds entries (a test's folder of worker extensions) is no bar: the child puts them on sys.path.

A forked ``diffserve serve`` or ``generate`` (or what asks with ``fork_server=True``) also gets its mp fork
server forked from itself before it runs (``_fork_the_fork_server``), instead of the fresh interpreter
multiprocessing would start on its first worker: that one re-imports torch, diffusers and transformers (~6 CPU-s
on 2 cores, once per mp server of the suite).

``LaunchedProcess`` answers the part of ``subprocess.Popen`` the tests use (pid, poll, wait, send_signal,
terminate, kill, returncode): the launcher reaps the child and sends its exit status down the request's
connection.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# What `diffserve serve` (and the other CLI commands) import before their first request; the rest of what a
# server imports comes in as their dependencies.
PRELOAD = (
    "diffserve.entrypoints.cli",
    "diffserve.entrypoints.commands.serve",
    "diffserve.entrypoints.commands.generate",
    "diffserve.entrypoints.openai.app",
    "diffserve.entrypoints.jobs.store",
    "diffserve.engine.async_engine",
    "diffserve.executor.uni",
    "diffserve.executor.mp",
    "diffserve.models.flux.pipeline",
    "diffserve.models.flux.encoders",
    "transformers.models.clip.modeling_clip",
    "transformers.models.t5.modeling_t5",
    "diffusers.models.autoencoders.autoencoder_kl",
    "uvicorn",
)
# Read when a preloaded module is imported, so a request that sets them differently cannot be forked.
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DIFFUSERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_",
                   "KMP_", "CUDA_", "TOKENIZERS_", "XDG_CACHE_HOME", "PYTHON")
_TESTS_DIR = Path(__file__).resolve().parent
_PYTHONPATH_AT_IMPORT = os.environ.get("PYTHONPATH")  # imported at collection, before any test's fixture runs


def python_path_with(*folders: Path | str) -> str:
    """This process's PYTHONPATH with ``folders`` first: for a launched program (or the server's workers) that
    imports a module of the tests' own folders (``tests/``, a folder of worker extensions). The launcher forks it
    all the same: a PYTHONPATH that only adds entries goes onto the child's ``sys.path``."""
    return os.pathsep.join(filter(None, [*map(str, folders), os.environ.get("PYTHONPATH")]))


def _import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_ENV) and k not in ("PYTHONUNBUFFERED", "PYTHONPATH")}


def _python_path(env: dict[str, str]) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


# --- the client side (in the pytest process) ---------------------------------------------------------------


class LaunchedProcess:
    """A process forked by the launcher: the ``subprocess.Popen`` surface the tests use."""

    def __init__(self, conn: socket.socket, args: list[str]) -> None:
        self.args = args
        self._conn = conn
        self._buffer = b""
        self.pid: int = int(self._read_message(None)["pid"])
        self.returncode: int | None = None

    def _read_message(self, timeout: float | None) -> dict[str, Any]:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the preloaded launcher went away while {self.args} ran")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError, BlockingIOError):
                self.returncode = int(self._read_message(0.0)["returncode"])
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self._read_message(timeout)["returncode"])
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """The launcher of this pytest process (``launcher()``): started on first use, ends when pytest does."""

    def __init__(self) -> None:
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        # The pytest process's own PYTHONPATH, not a test's that happens to start the launcher (a test adds its
        # folder for its servers' extension modules; a later test's server would then be refused the fork).
        self.env.pop("PYTHONPATH", None)
        self.env.update({"PYTHONPATH": _PYTHONPATH_AT_IMPORT} if _PYTHONPATH_AT_IMPORT is not None else {})
        self._dir = tempfile.mkdtemp(prefix="diffserve-launcher-")
        self.address = os.path.join(self._dir, "socket")
        # stdin is the lifeline: the launcher exits when this pipe closes (pytest ended, however it ended).
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__)), self.address], env=self.env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=_TESTS_DIR)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the preloaded launcher failed to start ({self._proc.wait()})")

    def accepts(self, env: dict[str, str]) -> bool:
        # A PYTHONPATH that adds entries to the launcher's (a test's own extension modules) is put on the child's
        # sys.path; one that lacks an entry of the launcher's could not be undone for modules already imported.
        return (self._proc.poll() is None and _import_time_env(env) == _import_time_env(self.env)
                and set(_python_path(self.env)) <= set(_python_path(env)))

    def popen(self, module: str, args: list[str], env: dict[str, str], stdout: Path, stderr: Path,
              cwd: Path | None = None, fork_server: bool = False) -> LaunchedProcess:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.address)
        request = {"module": module, "args": args, "env": env, "stdout": str(stdout), "stderr": str(stderr),
                   "cwd": str(cwd or os.getcwd()), "fork_server": fork_server}
        conn.sendall(json.dumps(request).encode() + b"\n")
        return LaunchedProcess(conn, [sys.executable, "-m", module, *args])


_launcher: Launcher | None = None
_launcher_lock = threading.Lock()


def start(module: str, args: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None,
          stderr_path: Path | None = None, fork_server: bool | None = None) -> LaunchedProcess | subprocess.Popen:
    """``python -m module *args`` with ``env``, stdout (and stderr, unless ``stderr_path``) appended to
    ``log_path``: forked from the launcher where the environment allows it, else a plain subprocess
    (``DIFFSERVE_TEST_NO_LAUNCHER=1``: always). ``fork_server``: the process will start an mp executor, so its
    fork server is forked from it first (default: for ``diffserve serve`` and ``generate``)."""
    if fork_server is None:
        fork_server = module.startswith("diffserve") and args[:1] in (["serve"], ["generate"])
    global _launcher
    if os.environ.get("DIFFSERVE_TEST_NO_LAUNCHER") != "1":
        with _launcher_lock:
            if _launcher is None:
                _launcher = Launcher()
        if _launcher.accepts(env):
            return _launcher.popen(module, args, env, log_path, stderr_path or log_path, cwd, fork_server)
    # As the launcher's child does: each stream opened for appending, the same file when stderr has none of its own.
    with open(log_path, "ab") as out, open(stderr_path or log_path, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", module, *args], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def run(module: str, *args: object, env: dict[str, str] | None = None, timeout: float = 300,
        cwd: Path | None = None, fork_server: bool | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", module, *args], capture_output=True, text=True)`` through the
    launcher; ``env`` defaults to this process's, offline; ``fork_server`` as for ``start``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} if env is None else env
    argv = [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="diffserve-run-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = start(module, argv, env, out, cwd=cwd, stderr_path=err, fork_server=fork_server)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], code,
                                           out.read_text(errors="replace"), err.read_text(errors="replace"))


# --- the launcher process ----------------------------------------------------------------------------------


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m module args`` and never return."""
    code = 1
    try:
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.close(null_fd)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out_fd, fd)
            os.close(out_fd)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own stdout
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # what `python -m` puts first, then PYTHONPATH's entries
        sys.path[1:1] = [entry for entry in _python_path(request["env"]) if entry not in sys.path]
        sys.argv = [request["module"], *request["args"]]
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request["fork_server"]:
            _fork_the_fork_server()
        # `python -m` runs the module as __main__ without importing it under its name first (runpy warns).
        sys.modules.pop(request["module"], None)
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported like the interpreter would, then the exit status
        import traceback

        traceback.print_exc()
    finally:  # what the interpreter's exit does that matters: threads joined, atexit handlers, flushed output
        with contextlib.suppress(BaseException):
            # The interpreter's own first step: threading's exit hooks (a ThreadPoolExecutor's tell its idle
            # workers to stop), then every non-daemon thread joined.
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fork_the_fork_server() -> None:
    """Start this process's mp fork server as a fork of itself, now, while it has one thread and no torch op
    has run: what multiprocessing would start on the first mp worker is a fresh interpreter importing
    ``FORKSERVER_PRELOAD`` (~6 CPU-s on 2 cores, one per server); this one has them imported already. The
    stdlib's bookkeeping is filled in as its own ``ensure_running`` does, so the executor finds a running
    server (its pid is this process's child) and uses it. Where the stdlib's internals differ from the ones
    this knows (Python 3.14 added an auth key), nothing is done and the stdlib starts its own."""
    from multiprocessing import connection, forkserver, resource_tracker

    from diffserve.executor.mp import FORKSERVER_PRELOAD

    server = forkserver._forkserver
    known = {"_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_preload_modules"}
    if sys.version_info >= (3, 14) or not known <= vars(server).keys() or server._forkserver_pid is not None:
        return
    # Another Python thread could hold a lock the fork would copy. (numpy's OpenBLAS keeps a native pool
    # thread from import on; it shuts it down around a fork itself, as every fork of the launcher relies on.)
    if threading.active_count() != 1:
        return
    resource_tracker.ensure_running()  # before the fork, as the stdlib does: workers report to it
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # EOF on alive_r when every holder of alive_w is gone: the server exits
        pid = os.fork()
        if pid == 0:
            try:
                os.close(alive_w)
                forkserver.main(listener.fileno(), alive_r, list(FORKSERVER_PRELOAD))
            finally:
                os._exit(0)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    server._preload_modules = list(FORKSERVER_PRELOAD)


def serve(address: str) -> None:
    try:
        _serve(address)
    finally:  # the socket's private directory goes with the launcher (pytest made it for this launcher only)
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


def _serve(address: str) -> None:
    # A server's mp fork server is forked from the server (_fork_the_fork_server): what it imports comes too.
    from diffserve.executor.mp import FORKSERVER_PRELOAD

    for name in (*PRELOAD, *FORKSERVER_PRELOAD):
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.buffer, selectors.EVENT_READ, "lifeline")
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select(timeout=0.05):
            if key.data == "lifeline":
                if not os.read(sys.stdin.fileno(), 4096):
                    return
            elif key.data == "accept":
                conn, _ = listener.accept()
                with conn.makefile("rb") as reader:
                    request = json.loads(reader.readline())
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    selector.close()
                    _run_child(request)
                children[pid] = conn
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while children:  # reap: the exit status goes to whoever asked for the process
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
