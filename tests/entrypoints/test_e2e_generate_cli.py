"""``diffserve generate`` as a user runs it (a real process), and the CLI's cheap
--help."""

from __future__ import annotations

import subprocess
import sys

import programs
import pytest
from PIL import Image

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "diffserve.entrypoints.cli"]


def run_cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m diffserve.entrypoints.cli *args`` in a process of its own."""
    return programs.run("diffserve.entrypoints.cli", *args, timeout=timeout)


def run_in_process(
    capsys: pytest.CaptureFixture[str], *args: object
) -> subprocess.CompletedProcess:
    """The CLI's ``main`` in this process, as ``run_cli`` reports it: for a flag's
    behaviour, where a real process adds only its start-up (the real process is this
    module's own tests)."""
    from diffserve.entrypoints.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)


def test_generate_writes_images_with_metadata(tiny_flux_dir, tmp_path) -> None:
    out = tmp_path / "fox.png"
    proc = run_cli(
        "generate",
        tiny_flux_dir,
        "a red fox",
        "-o",
        out,
        "--seed",
        7,
        "--steps",
        2,
        "--size",
        "64x32",
        "-n",
        2,
        "--enforce-eager",
    )
    assert proc.returncode == 0, proc.stderr
    paths = [tmp_path / "fox-0.png", tmp_path / "fox-1.png"]
    for path, seed in zip(paths, (7, 8), strict=True):
        img = Image.open(path)
        assert img.size == (64, 32)
        assert (img.text["seed"], img.text["prompt"], img.text["steps"]) == (
            str(seed),
            "a red fox",
            "2",
        )
        assert f"seed {seed}" in proc.stdout
    # The progress bar (tqdm, on stderr) reached both steps.
    assert "2/2" in proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("a", "b", "c"), "quote the prompt"),
        (("a fox", "-o", "fox.gif"), "must end in one of"),
        (("a fox", "--size", "65x64"), "size"),
    ],
)
def test_generate_bad_arguments_fail_fast(args: tuple, needle: str, tmp_path) -> None:
    proc = run_cli("generate", *args, timeout=60)
    assert proc.returncode != 0 and needle in proc.stderr, proc.stderr


def test_help_is_cheap() -> None:
    code = (
        "import sys; from diffserve.entrypoints.cli import "
        "build_parser; build_parser();"
        "heavy = [m for m in ('torch', 'fastapi', 'uvicorn', "
        "'diffusers') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    for command in ("serve", "generate"):
        proc = run_cli(command, "--help", timeout=60)
        assert (
            proc.returncode == 0
            and "--deploy-config" in proc.stdout
            and "--linear-backend" in proc.stdout
        )
    assert "--api-key" in run_cli("serve", "--help", timeout=60).stdout
