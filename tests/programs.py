"""The tests' own one-process programs: ``diffserve serve`` and the other CLI commands,
the benchmark smoke run and the small programs in tests/ (``mp_parent``,
``openmp_threads``, ``compile_once``), each ``python -m MODULE`` in a plain subprocess
of its own, as a user's shell starts it: fresh imports, its own multiprocessing fork
server, its own exit. What a test learns from such a process is then the product's own
behaviour, start-up included. The suite keeps its time by sharing these processes (one
server per module for many requests), not by starting them differently."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def python_path_with(*folders: Path | str) -> str:
    """This process's PYTHONPATH with ``folders`` first: for a program (or the server's
    workers) that imports a module of the tests' own folders (``tests/``, a folder of
    worker extensions)."""
    return os.pathsep.join(
        filter(None, [*map(str, folders), os.environ.get("PYTHONPATH")])
    )


def start(
    module: str,
    args: list[str],
    env: dict[str, str],
    log_path: Path,
    cwd: Path | None = None,
    stderr_path: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m module *args`` with ``env``, its output appended to ``log_path``
    (stderr to ``stderr_path`` when given, so a restarted server's log keeps the earlier
    run)."""
    with open(log_path, "ab") as out, open(stderr_path or log_path, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )


def run(
    module: str,
    *args: object,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", module, *args], capture_output=True,
    text=True)``, offline unless ``env`` says otherwise; killed (and the
    ``TimeoutExpired`` raised) after ``timeout`` seconds."""
    env = {**os.environ, **OFFLINE} if env is None else env
    argv = [sys.executable, "-m", module, *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="diffserve-run-") as tmp:
        # Files, not pipes: a server or worker the program leaves behind cannot hold
        # run() open on a pipe.
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = start(module, [str(a) for a in args], env, out, cwd=cwd, stderr_path=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(
            argv, code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )
