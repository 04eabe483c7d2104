"""Shared fixtures. Tests never touch a hub: HF_HUB_OFFLINE is forced before anything
imports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from xdist_units import LONG_FIRST, RAY_GROUP, unit

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The platform-default dtype depends on the CPU (bfloat16 with AVX512-BF16/AMX, else
# float32): the suite pins "no native bfloat16" so it behaves alike on every machine
# kind; tests/config/test_platform_defaults.py injects both kinds, and servers and
# workers started by tests inherit the pin.
os.environ["DIFFSERVE_CPU_BF16"] = "0"
# Under pytest-xdist (make test: three workers on two cores) OpenMP threads sleep
# between parallel regions instead of spinning: processes each spinning a 2-thread team
# on two cores steal each other's cores (measured on 2 cores: the suite 800 s spinning,
# 555-625 s passive). Not OMP_NUM_THREADS=1: thread counts change which kernels oneDNN
# picks, and the suite's numerics should be the serial run's. Set before torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# --- caches: the suite neither reads nor writes the user's
# --------------------------------------------- diffserve's compile cache (default
# ~/.cache/diffserve) and torch inductor's own (default /tmp/torchinductor_<user>) live
# in one directory per run, made by the controlling process (serial, or the xdist
# controller, before its workers start: they inherit it and share it) and removed at its
# end. A warm cache from an earlier run would hide what a fresh machine pays (the
# compile tests: ~75 s warm, ~105 s cold on 2 cores).
_CACHE_ROOT_ENV = "DIFFSERVE_TEST_CACHE_ROOT"
_CACHE_ROOT = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or _CACHE_ROOT_ENV in os.environ:
        return
    import tempfile

    root = tempfile.mkdtemp(prefix="diffserve-test-cache-")
    os.environ[_CACHE_ROOT_ENV] = root
    os.environ["DIFFSERVE_CACHE_DIR"] = os.path.join(root, "diffserve")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    # State (the provenance signing key made on first use, a video job store without
    # state_dir) too: an in-process generate or app never writes ~/.local/state.
    os.environ["XDG_STATE_HOME"] = os.path.join(root, "state")
    config.stash[_CACHE_ROOT] = root


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_CACHE_ROOT, None)
    if root is not None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        os.environ.pop(_CACHE_ROOT_ENV, None)


# --- hermetic tiny models (built once per run by diffserve.zoo, shared by every xdist
# worker) ------------
def _shared_model(name: str, build) -> Path:
    """``build(target)`` once per test run: in the run's cache root, under a file lock,
    so the first worker that needs a model builds it and the others wait and read it
    (the builders are deterministic; a test that changes a model works on its own
    copy)."""
    import fcntl

    root = Path(os.environ[_CACHE_ROOT_ENV]) / "models"
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "model_index.json").is_file():
            build(target)
    return target


def _wan(kind: str) -> Path:
    from diffserve.zoo.wan import build_wan_model

    return _shared_model(kind, lambda target: build_wan_model(kind, target, seed=0))


@pytest.fixture(scope="session")
def tiny_wan_dir() -> Path:
    """Wan2.1-shaped text-to-video (one expert), seed 0."""
    return _wan("tiny-wan")


@pytest.fixture(scope="session")
def tiny_wan22_dir() -> Path:
    """Wan2.2-shaped two-expert (MoE) text-to-video, seed 0."""
    return _wan("tiny-wan22")


@pytest.fixture(scope="session")
def tiny_wan22_i2v_dir() -> Path:
    """Wan2.2-shaped two-expert image-to-video, seed 0."""
    return _wan("tiny-wan22-i2v")


@pytest.fixture(scope="session")
def tiny_flux_dir() -> Path:
    """A schnell-like (no guidance embedding) random-weight tiny-flux pipeline dir, seed
    0."""
    from diffserve.zoo.flux import build_flux_model

    return _shared_model(
        "tiny-flux", lambda target: build_flux_model("tiny-flux", target, seed=0)
    )


@pytest.fixture(scope="session")
def tiny_flux_kontext_dir() -> Path:
    """A random-weight tiny FluxKontextPipeline dir (FLUX.1 Kontext: edits from a
    reference image), seed 0."""
    from diffserve.zoo.flux import build_flux_model

    return _shared_model(
        "tiny-flux-kontext",
        lambda target: build_flux_model("tiny-flux-kontext", target, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_sd3_dir() -> Path:
    """A random-weight tiny StableDiffusion3Pipeline dir (the generic path), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-sd3", lambda target: build_generic_model("tiny-sd3", target, seed=0)
    )


@pytest.fixture(scope="session")
def tiny_pixart_dir() -> Path:
    """A random-weight tiny PixArtSigmaPipeline dir (the generic path), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-pixart-sigma",
        lambda target: build_generic_model("tiny-pixart-sigma", target, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_qwen_image_dir() -> Path:
    """A random-weight tiny QwenImagePipeline dir (the generic path, a Qwen2.5-VL text
    encoder), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-qwen-image",
        lambda target: build_generic_model("tiny-qwen-image", target, seed=0),
    )


def _own_builder_model(kind: str) -> Path:
    """A kind whose family has a builder module of its own (``zoo/kinds.py``), seed
    0."""
    from diffserve.zoo.kinds import own_builder

    return _shared_model(kind, lambda target: own_builder(kind)(kind, target, seed=0))


@pytest.fixture(scope="session")
def tiny_qwen_image21_dir() -> Path:
    """A random-weight tiny QwenImage21Pipeline dir (Qwen3-VL encoder, prefix KV cache,
    RGBA VAE), seed 0."""
    return _own_builder_model("tiny-qwen-image-21")


@pytest.fixture(scope="session")
def tiny_hunyuan_video15_dir() -> Path:
    """A random-weight tiny HunyuanVideo15Pipeline dir, seed 0."""
    return _own_builder_model("tiny-hunyuan-video-15")


@pytest.fixture(scope="session")
def tiny_ltx2_dir() -> Path:
    """A random-weight tiny LTX2Pipeline dir (a video and its audio), seed 0."""
    return _own_builder_model("tiny-ltx2")


@pytest.fixture(scope="session")
def tiny_qwen_image_edit_dir() -> Path:
    """A random-weight tiny QwenImageEditPipeline dir (Qwen-Image with a Qwen2-VL
    processor), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-qwen-image-edit",
        lambda target: build_generic_model("tiny-qwen-image-edit", target, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_qwen_image_edit_plus_dir() -> Path:
    """A random-weight tiny QwenImageEditPlusPipeline dir (Qwen-Image-Edit-2509's
    pipeline), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-qwen-image-edit-plus",
        lambda target: build_generic_model("tiny-qwen-image-edit-plus", target, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_z_image_dir() -> Path:
    """A random-weight tiny ZImagePipeline dir (the generic path, a Qwen3 text encoder),
    seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-z-image",
        lambda target: build_generic_model("tiny-z-image", target, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_flux2_klein_dir() -> Path:
    """A random-weight tiny Flux2KleinPipeline dir (the generic path, a 27-layer Qwen3
    text encoder), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-flux2-klein",
        lambda target: build_generic_model("tiny-flux2-klein", target, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_flux2_dir() -> Path:
    """A random-weight tiny Flux2Pipeline dir (FLUX.2-dev: a Mistral3 text encoder, a
    Pixtral processor), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return _shared_model(
        "tiny-flux2", lambda target: build_generic_model("tiny-flux2", target, seed=0)
    )


@pytest.fixture(scope="session")
def tiny_flux_dev_dir() -> Path:
    """A dev-like (guidance_embeds=True) random-weight tiny-flux pipeline dir, seed
    0."""
    from diffserve.zoo.flux import build_flux_model

    return _shared_model(
        "tiny-flux-dev",
        lambda target: build_flux_model(
            "tiny-flux", target, seed=0, guidance_embeds=True
        ),
    )


@pytest.fixture(scope="session")
def small_flux_dir() -> Path:
    """The random-weight small-flux pipeline dir (seed 0): quality gates and larger
    parity checks."""
    from diffserve.zoo.flux import build_flux_model

    return _shared_model(
        "small-flux", lambda target: build_flux_model("small-flux", target, seed=0)
    )


# --- Ray (the ray executor)
# ------------------------------------------------------------------------
@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the session's Ray tests, started only when a ray-parametrized
    test asks for it.

    The executors reuse an initialized Ray instead of starting their own. It is theirs:
    the executor's ``connect("")`` starts it (``start_local_ray``: every node address on
    127.0.0.1, which tests/e2e/test_ray.py checks; PYTHONPATH carries the test
    directories, which pytest puts on sys.path, so worker extensions defined in test
    modules import inside the actors). Logical CPUs are bookkeeping only: at least 4,
    because a module-scoped 2-rank executor fixture can be alive while a test starts
    another executor (each rank holds one CPU bundle). It stops when the Ray group's
    last test ends (``pytest_runtest_teardown`` below), not with the session: an idle
    Ray costs ~3% of a core for the rest of the run.
    """
    ray = pytest.importorskip("ray")
    _start_session_ray()
    yield ray
    ray.shutdown()


def _start_session_ray() -> None:
    import ray

    from diffserve.executor.ray_connect import connect

    # The executor's own local Ray (ray_address ""), with more logical CPUs.
    if not ray.is_initialized():
        connect("", num_cpus=max(4, os.cpu_count() or 2), log_to_driver=False)


def _session_ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


# The test after which the session's Ray was stopped, if it was.
_stopped_ray_group: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the Ray group's last test (its fixtures already finalized: trylast), the
    session's Ray stops."""
    if (
        unit(item.nodeid) == RAY_GROUP
        and (nextitem is None or unit(nextitem.nodeid) != RAY_GROUP)
        and _session_ray_running()
    ):
        sys.modules["ray"].shutdown()
        _stopped_ray_group.append(item.nodeid)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Ray test after the group was stopped (a serial run of hand-picked tests) finds
    the session's Ray again."""
    if unit(item.nodeid) == RAY_GROUP and _stopped_ray_group:
        _stopped_ray_group.clear()
        _start_session_ray()


# --- pytest-xdist (make test runs the suite on three workers; the units:
# tests/xdist_units.py) ----------
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long units first (a stable sort: modules keep their own order and stay together);
    ``gpu`` tests skip where torch sees no CUDA device (``make gpu-check`` runs them
    where it does)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items:
        import torch

        if not torch.cuda.is_available():
            for item in gpu_items:
                item.add_marker(
                    pytest.mark.skip(
                        reason="needs a CUDA device (make gpu-check runs it on one)"
                    )
                )

    def rank(item: pytest.Item) -> int:
        name = unit(item.nodeid)
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole units go to one worker (module-scoped servers and engines start once; one
    Ray), in collection order (long first), not xdist's default of most tests first."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)
