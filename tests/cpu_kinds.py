"""``make test-kinds``: the numerics tests (``-m numerics``) again under every other CPU
kind this machine can emulate, so a developer on one kind checks the others.

The suite runs on whatever kind CI or a session draws: AVX2 only, AVX512-BF16 or Intel
AMX. A kind can be emulated on a machine with its instructions
(``diffserve.config.platform.emulation_env``: ATen's, oneDNN's and MKL's kernels capped
at the kind's instructions, and the kind detection told the same), never on a lesser
one: an AMX machine checks AVX512-BF16 and AVX2, an AVX512-BF16 machine AVX2, and an
AVX2 machine only itself, which the main run already did. Each kind's run is a fresh
pytest process (the caps are read when torch loads), on the same xdist workers as ``make
test``.

    python tests/cpu_kinds.py [--kinds AVX2,AVX512_BF16] [pytest arguments...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from diffserve.config.platform import cpu_kind, emulate, emulation_env
from diffserve.errors import ConfigError

# The kinds the suite must hold on, most capable first (docs/architecture.md, "Tests").
SUITE_KINDS = ("AMX", "AVX512_BF16", "AVX2")


def int8_gemm_unlike_the_kind() -> str:
    """Why an int8 GEMM in this process would not compute as the emulated kind's CPUs do
    ('' where it would). torch sends ``_int_mm`` to oneDNN when the hardware has VNNI
    (read by cpuinfo, which no environment variable caps); under an emulated kind
    without it oneDNN is capped at AVX2 and runs its u8s8 kernel, whose int16 pair sums
    saturate (max error 67550 on a 64x256x64 product on an AVX512-BF16 machine), a path
    no AVX2 CPU takes: there torch runs its exact int32 loop. Such a result says nothing
    about the kind."""
    import torch

    kind = cpu_kind()
    if kind.emulated_on and not kind.avx512 and torch.cpu._is_vnni_supported():
        return (
            "int8 GEMMs are not emulated: torch picks oneDNN by "
            f"this {kind.emulated_on} CPU's VNNI, and oneDNN "
            f"capped at {kind.name} saturates (tests/cpu_kinds.py, "
            "int8_gemm_unlike_the_kind)"
        )
    return ""


def kinds_below(machine: str) -> list[str]:
    """The suite's kinds this machine can emulate, its own excluded."""
    return (
        list(SUITE_KINDS[SUITE_KINDS.index(machine) + 1 :])
        if machine in SUITE_KINDS
        else []
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kinds",
        help="comma-separated kinds to emulate (default: every kind below this one)",
    )
    args, pytest_args = parser.parse_known_args(argv)
    machine = cpu_kind()
    kinds = args.kinds.upper().split(",") if args.kinds else kinds_below(machine.name)
    try:
        for kind in kinds:
            emulate(machine, kind)
    except ConfigError as exc:
        print(f"test-kinds: {exc}")
        return 2
    if not kinds:
        print(
            f"test-kinds: this {machine.describe()} CPU can emulate "
            f"none of {', '.join(SUITE_KINDS)} below it "
            "(a kind needs its instructions); the main run checked it"
        )
        return 0
    failed = []
    # One cache root for every kind's run (tests/conftest.py reads it): the tiny models
    # are built once, by the first kind, not once a kind; each run still compares only
    # what it computed itself.
    root = tempfile.mkdtemp(prefix="diffserve-test-kinds-")
    caches = {
        "DIFFSERVE_TEST_CACHE_ROOT": root,
        "DIFFSERVE_CACHE_DIR": os.path.join(root, "diffserve"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
    }
    try:
        for kind in kinds:
            if not run_kind(
                kind,
                machine.name,
                {**os.environ, **caches, **emulation_env(kind)},
                pytest_args,
            ):
                failed.append(kind)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if failed:
        print(f"test-kinds: failed under {', '.join(failed)}")
    return 1 if failed else 0


def run_kind(
    kind: str, machine: str, env: dict[str, str], pytest_args: list[str]
) -> bool:
    """The numerics tests in a fresh pytest process computing as ``kind``; whether they
    passed."""
    print(
        f"test-kinds: the numerics tests as {kind} (emulated on {machine})", flush=True
    )
    started = time.monotonic()
    code = subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-m", "numerics", *pytest_args], env=env
    )
    print(
        f"test-kinds: {kind}: {'passed' if code == 0 else f'FAILED ({code})'} in "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    return code == 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
