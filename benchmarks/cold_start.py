"""(e) Cold start: process start to first image for ``diffserve generate`` and for the
equivalent minimal diffusers script (diffusers_generate.py), each process's peak RSS,
and ``diffserve serve`` process start to 200 on /ready and to its first image over HTTP.

``diffserve generate --no-enforce-eager`` (compiled blocks) is timed twice over: its
first start, with an empty compile cache (DIFFSERVE_CACHE_DIR pointed at a fresh
directory, once), then its second and later starts, which reuse that directory's
compiled graphs (worker/compile_cache.py), interleaved with the others. The second start
is compared with the ``--enforce-eager`` start.

Each one-shot command runs under a tiny launcher process that waits for it and reads
getrusage(RUSAGE_CHILDREN), so the peak RSS is that command's alone (ru_maxrss of the
largest descendant; mp workers would count as their own descendants). Runs alternate
diffserve/diffusers."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median, subprocess_env
from benchmarks.http_client import sync_call
from benchmarks.section import Section
from benchmarks.server import Server, diffserve_cmd
from benchmarks.settings import PROMPT, SEED, Settings

HERE = Path(__file__).resolve().parent

# Runs argv, then prints the child's wall seconds, exit code and peak RSS (KiB on Linux)
# as JSON.
LAUNCHER = (
    "import json, resource, subprocess, sys, time\n"
    "t0 = time.perf_counter(); rc = subprocess.call(sys.argv[1:], "
    "stdout=subprocess.DEVNULL)\n"
    "wall = time.perf_counter() - t0\n"
    "print(json.dumps({'wall_s': wall, 'rc': rc,"
    " 'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
)


def launch(
    cmd: list[str], timeout: float = 900, env: dict[str, str] | None = None
) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *cmd],
        capture_output=True,
        text=True,
        env={**subprocess_env(), **(env or {})},
        timeout=timeout,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"launcher failed: {proc.stderr.strip()[-500:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited with {result['rc']}")
    return result


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.cold_case
    path = models[case.model]
    section.notes.append(
        f"{case.label}, float32, max_sequence_length 512 (the "
        "diffusers script and `diffserve generate` defaults)."
    )
    section.columns = [
        "contender",
        "median s to first image",
        "median s to /ready",
        "runs",
        "peak RSS MiB",
        "ratio vs diffusers script",
    ]
    with tempfile.TemporaryDirectory(prefix="diffserve-bench-") as tmp:
        out = Path(tmp) / "out.png"
        common = [
            str(path),
            PROMPT,
            "-o",
            str(out),
            "--steps",
            str(case.steps),
            "--size",
            f"{case.size}x{case.size}",
            "--seed",
            str(SEED),
            "--no-progress",
            "--dtype",
            "float32",
        ]
        # The compiled contenders' own compile cache: empty for the first start, warm
        # for the others.
        compile_env = {"DIFFSERVE_CACHE_DIR": str(Path(tmp) / "diffserve-cache")}
        # slug (metrics key) -> (row label, command, extra environment)
        cmds: dict[str, tuple[str, list[str], dict[str, str]]] = {
            "diffusers": (
                "diffusers script",
                [
                    sys.executable,
                    str(HERE / "diffusers_generate.py"),
                    str(path),
                    PROMPT,
                    str(out),
                    str(case.steps),
                    str(case.size),
                    str(SEED),
                ],
                {},
            ),
            "generate_default": (
                "diffserve generate (default config)",
                [*diffserve_cmd(), "generate", *common],
                {},
            ),
            "generate_eager": (
                "diffserve generate --enforce-eager",
                [*diffserve_cmd(), "generate", *common, "--enforce-eager"],
                {},
            ),
        }
        # on a CPU the default config is eager: the same command twice costs the suite a
        # start
        if settings.smoke:
            del cmds["generate_eager"]
        compiled = [*diffserve_cmd(), "generate", *common, "--no-enforce-eager"]
        runs: dict[str, list[dict[str, Any]]] = {}
        if settings.cold_compile:
            runs["compile_first"] = [launch(compiled, env=compile_env)]
            cmds["compile_first"] = (
                "diffserve generate --no-enforce-eager, first start "
                "(empty compile cache)",
                compiled,
                compile_env,
            )
            cmds["compile_second"] = (
                "diffserve generate --no-enforce-eager, second start "
                "(compile cache warm)",
                compiled,
                compile_env,
            )
        timed = [name for name in cmds if name != "compile_first"]
        runs.update({name: [] for name in timed})
        for i in range(settings.cold_repeats):
            for name in timed if i % 2 == 0 else timed[::-1]:
                runs[name].append(launch(cmds[name][1], env=cmds[name][2]))
        base_s = median([r["wall_s"] for r in runs["diffusers"]])
        base_rss = max(r["maxrss_kib"] for r in runs["diffusers"]) / 1024
        for slug in cmds:
            results = runs[slug]
            wall = median([r["wall_s"] for r in results])
            rss = max(r["maxrss_kib"] for r in results) / 1024
            section.add(
                cmds[slug][0],
                round(wall, 2),
                "",
                len(results),
                round(rss, 1),
                f"{wall / base_s:.2f}",
            )
            section.metrics[f"cold.{slug}.s"] = wall
            section.metrics[f"cold.{slug}.rss_mib"] = rss
            section.metrics[f"cold.{slug}.ratio"] = wall / base_s
            section.metrics[f"cold.{slug}.rss_ratio"] = rss / base_rss
        if settings.cold_compile:
            eager_s = section.metrics["cold.generate_eager.s"]
            section.metrics["cold.compile_second.vs_eager"] = (
                section.metrics["cold.compile_second.s"] / eager_s
            )
            section.notes.append(
                "Compiled second start "
                f"/ eager start: {section.metrics['cold.compile_second.vs_eager']:.2f} "
                f"(first start {section.metrics['cold.compile_first.s']:.1f} "
                "s). A restart still re-traces the "
                "two block classes with dynamo; their graphs and kernels "
                "come from the compile cache."
            )
        # a server start costs the suite ~10 s; section c starts one through the same
        # harness
        if settings.smoke:
            section.notes.append("diffserve serve: measured in full runs only")
        else:
            _serve(section, settings, path, base_s, Path(tmp))


def _serve(
    section: Section, settings: Settings, path: Path, base_s: float, tmp: Path
) -> None:
    case = settings.cold_case
    ready, first, rss = [], [], []
    for _ in range(settings.cold_repeats):
        with Server(
            path, ["--dtype", "float32", "--enforce-eager"], log=tmp / "serve.log"
        ) as srv:
            ready.append(srv.ready_s)
            sync_call(srv.base_url, path.name, case)()
            first.append(time.perf_counter() - srv.started)
            rss.append(srv.peak_rss_mib())
    section.add(
        "diffserve serve (eager)",
        round(median(first), 2),
        round(median(ready), 2),
        len(ready),
        round(max(rss), 1),
        f"{median(first) / base_s:.2f}",
    )
    section.metrics["cold.serve.ready_s"] = median(ready)
    section.metrics["cold.serve.first_image_s"] = median(first)
    section.metrics["cold.serve.rss_mib"] = max(rss)
