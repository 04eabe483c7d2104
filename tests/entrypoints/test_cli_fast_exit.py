"""``diffserve generate`` run as the process's command ends it without the interpreter's
teardown (``cli._exit_now``); ``main([...])`` called from Python returns its code as
before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from diffserve.entrypoints import cli


class _Exited(Exception):
    pass


def test_generate_from_python_returns_and_as_the_command_exits_now(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise _Exited

    monkeypatch.setattr(cli, "_exit_now", fake_exit)
    # Refused before anything loads.
    bad = ["generate", "a fox", "-o", str(tmp_path / "out.gif")]
    assert cli.main(bad) == 1 and codes == []
    monkeypatch.setattr(sys, "argv", ["diffserve", *bad])
    with pytest.raises(_Exited):
        cli.main()
    assert codes == [1]
    monkeypatch.setattr(sys, "argv", ["diffserve", "config", "schema"])
    assert cli.main() == 0 and codes == [1]  # other commands exit normally


def test_exit_now_runs_atexit_handlers_and_flushes(tmp_path: Path) -> None:
    marker = tmp_path / "atexit"
    code = (
        "import atexit, sys\n"
        "from diffserve.entrypoints.cli import _exit_now\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "sys.stdout.write('buffered, no newline')\n"
        "_exit_now(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert proc.stdout == "buffered, no newline"
    assert marker.read_text() == "ran"
