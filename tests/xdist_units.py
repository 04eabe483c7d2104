"""How ``make test`` splits the suite over pytest-xdist workers (tests/conftest.py's
scheduler): the units one worker takes whole, and which go first. A plain module so
tests can check the naming rule it relies on."""

from __future__ import annotations

import ast
import re
from pathlib import Path

RAY_GROUP = "ray"
# The modules served by tests/entrypoints/conftest.py's session-wide ``uni_server``
# (directly or through its ``client``): one unit, so one worker starts that server once
# instead of each worker its own.
SHARED_SERVER_GROUP = "uni_server"
# The tests that torch.compile tiny FLUX and SD3 blocks in process: one unit, so they
# run one after another on one worker and the later ones find the kernels the first
# compiled in the run's inductor cache (shape-generic kernels of the same ops are the
# same C++; measured on 2 cores: 54 s in a row against ~82 s apart).
COMPILE_GROUP = "compile"
COMPILE_TESTS = (
    "tests/models/test_flux_compile.py::",
    "tests/models/test_flux_onednn.py::test_compiled_blocks_match_eager_and_still_count",
    "tests/models/test_generic_pipeline.py::test_compiled_denoiser_counts_and_matches_eager",
    "tests/models/test_lora.py::test_compiled_engine_does_not_recompile_per_adapter",
)
# The longest units go first, so no worker is left with one of them at the end (CPU
# seconds, measured serially on 2 cores: the Ray tests ~115 together, the benchmark
# smoke ~100, the step cache quality gates ~75, the shared server's modules ~55;
# toy-motion's held-out clips ~40 s of wall time under `make test`; the toy-shapes
# checks, ~40 and ~26 before toy-shapes moved to a 32-token text window, now take a
# third of that). The next ones by wall time under `make test` (25-100 s each) follow,
# so the run ends on short units and the three workers finish together (measured: the
# last worker used to idle ~30 s behind a late long module).
LONG_FIRST = (
    "tests/benchmarks/test_bench_smoke.py",
    RAY_GROUP,
    COMPILE_GROUP,
    "tests/models/test_step_cache_quality.py",
    "tests/zoo/test_toy_motion_model.py",
    SHARED_SERVER_GROUP,
    "tests/executor/test_ray_cluster.py",
    "tests/e2e/test_ar_stages.py",
    "tests/e2e/test_replicas.py",
    "tests/ray_serve/test_ray_serve_autoscaling.py",
    "tests/adversarial/test_lifecycle.py",
    "tests/e2e/test_one_compute_thread.py",
    "tests/e2e/test_parallel_cfg.py",
    "tests/models/test_wan.py",
    "tests/zoo/test_toy_motion.py",
    "tests/zoo/test_toy_shapes.py",
    "tests/zoo/test_toy_shapes_lora.py",
    "tests/zoo/test_toy_shapes_edits.py",
    "tests/e2e/test_parallel_parity.py",
    "tests/e2e/test_wan_parallel.py",
    "tests/executor/test_executor_semantics.py",
    "tests/models/test_vae_tiling.py",
    "tests/adversarial/test_worker_faults.py",
    # Qwen-Image-2.1, LTX-2 and HunyuanVideo-1.5 (issue 64): a served pair of video
    # models, and plain-diffusers references beside an engine (~30-60 s each).
    "tests/entrypoints/jobs/test_video_audio.py",
    "tests/models/test_generic_qwen_image21.py",
    "tests/models/test_generic_video_families.py",
)
# A test of a Ray-using module runs on Ray when its name or parameter id says so:
# test_ray_..., ..._ray_..., [ray], [flux-ray]. The module's other tests stay a unit of
# their own.
RAY_TEST = re.compile(r"(^|[_\[-])ray([_\]-]|$)")
TESTS = Path(__file__).resolve().parent


def _modules_using_ray() -> frozenset[str]:
    """Test modules that ask for the session's Ray (``ray_session``)."""
    return frozenset(
        str(path.relative_to(TESTS.parent))
        for path in TESTS.rglob("test_*.py")
        if "ray_session" in path.read_text()
    )


RAY_MODULES = _modules_using_ray()


def _functions(path: Path) -> list[ast.FunctionDef]:
    return [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
    ]


def _test_arguments(functions: list[ast.FunctionDef]) -> set[str]:
    """The fixtures the module's tests take by name."""
    return {
        arg.arg
        for node in functions
        if node.name.startswith("test_")
        for arg in node.args.args
    }


def _uses_the_shared_server(path: Path) -> bool:
    """A fixture or test of the module takes ``uni_server``, or a test takes ``client``
    while the module defines no ``client`` of its own (helpers' parameters named
    ``client`` do not count)."""
    functions = _functions(path)
    anywhere = {arg.arg for node in functions for arg in node.args.args}
    return "uni_server" in anywhere or (
        "client" in _test_arguments(functions)
        and "client" not in {node.name for node in functions}
    )


SHARED_SERVER_MODULES = frozenset(
    str(path.relative_to(TESTS.parent))
    for path in (TESTS / "entrypoints").glob("test_*.py")
    if _uses_the_shared_server(path)
)

# tests/adversarial/conftest.py's session-scoped servers: the modules of each are one
# unit, so one worker starts it once (apart, each worker that runs one of them would
# start its own: ~6 CPU-s a server).
ADVERSARIAL_SERVERS = ("hardened_server", "busy_server")


def _adversarial_server_of(path: Path) -> str | None:
    """The session server a module's tests take (its name is the unit's), if any."""
    taken = _test_arguments(_functions(path))
    return next((name for name in ADVERSARIAL_SERVERS if name in taken), None)


ADVERSARIAL_SERVER_MODULES = {
    str(path.relative_to(TESTS.parent)): server
    for path in (TESTS / "adversarial").glob("test_*.py")
    if (server := _adversarial_server_of(path)) is not None
}


def unit(nodeid: str) -> str:
    """The unit of work one xdist worker takes whole: the Ray tests of every module (one
    Ray), the modules of the shared uni server or of one adversarial session server (one
    server), or the rest of a module (its module-scoped servers and engines start
    once)."""
    module, _, test = nodeid.partition("::")
    if module in RAY_MODULES and RAY_TEST.search(test):
        return RAY_GROUP
    if nodeid.startswith(COMPILE_TESTS):
        return COMPILE_GROUP
    if module in ADVERSARIAL_SERVER_MODULES:
        return ADVERSARIAL_SERVER_MODULES[module]
    return SHARED_SERVER_GROUP if module in SHARED_SERVER_MODULES else module
