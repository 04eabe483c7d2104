"""Shared fixtures. Tests never touch a hub: HF_HUB_OFFLINE is forced before anything imports."""

from __future__ import annotations

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The platform-default dtype depends on the CPU (bfloat16 with AVX512-BF16/AMX, else float32): the suite
# pins "no native bfloat16" so it behaves alike on every machine kind; tests/config/test_platform_defaults.py
# injects both kinds, and servers and workers started by tests inherit the pin.
os.environ["DIFFSERVE_CPU_BF16"] = "0"


# --- hermetic tiny FLUX models (built once per session by diffserve.zoo.flux) ---------------
@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory: pytest.TempPathFactory):
    """A schnell-like (no guidance embedding) random-weight tiny-flux pipeline dir, seed 0."""
    from diffserve.zoo.flux import build_flux_model

    return build_flux_model("tiny-flux", tmp_path_factory.mktemp("models") / "tiny-flux", seed=0)


@pytest.fixture(scope="session")
def tiny_flux_kontext_dir(tmp_path_factory: pytest.TempPathFactory):
    """A random-weight tiny FluxKontextPipeline dir (FLUX.1 Kontext: edits from a reference image), seed 0."""
    from diffserve.zoo.flux import build_flux_model

    return build_flux_model("tiny-flux-kontext", tmp_path_factory.mktemp("models") / "tiny-flux-kontext", seed=0)


@pytest.fixture(scope="session")
def tiny_sd3_dir(tmp_path_factory: pytest.TempPathFactory):
    """A random-weight tiny StableDiffusion3Pipeline dir (the generic path), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return build_generic_model("tiny-sd3", tmp_path_factory.mktemp("models") / "tiny-sd3", seed=0)


@pytest.fixture(scope="session")
def tiny_pixart_dir(tmp_path_factory: pytest.TempPathFactory):
    """A random-weight tiny PixArtSigmaPipeline dir (the generic path), seed 0."""
    from diffserve.zoo.generic import build_generic_model

    return build_generic_model("tiny-pixart-sigma", tmp_path_factory.mktemp("models") / "tiny-pixart-sigma",
                               seed=0)


@pytest.fixture(scope="session")
def tiny_flux_dev_dir(tmp_path_factory: pytest.TempPathFactory):
    """A dev-like (guidance_embeds=True) random-weight tiny-flux pipeline dir, seed 0."""
    from diffserve.zoo.flux import build_flux_model

    return build_flux_model(
        "tiny-flux", tmp_path_factory.mktemp("models") / "tiny-flux-dev", seed=0, guidance_embeds=True
    )


@pytest.fixture(scope="session")
def small_flux_dir(tmp_path_factory: pytest.TempPathFactory):
    """The random-weight small-flux pipeline dir (seed 0): quality gates and larger parity checks."""
    from diffserve.zoo.flux import build_flux_model

    return build_flux_model("small-flux", tmp_path_factory.mktemp("models") / "small-flux", seed=0)


# --- Ray (the ray executor) ------------------------------------------------------------------------
@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session, started only when a ray-parametrized test asks for it.

    The executors reuse an initialized Ray instead of starting their own. It is started as theirs is
    (``start_local_ray``: every node address on 127.0.0.1; PYTHONPATH carries the test directories, which
    pytest puts on sys.path, so worker extensions defined in test modules import inside the actors).
    Logical CPUs are bookkeeping only: at least 4, because a module-scoped 2-rank executor fixture can be
    alive while a test starts another executor (each rank holds one CPU bundle).
    """
    ray = pytest.importorskip("ray")
    from diffserve.executor.ray import start_local_ray

    if not ray.is_initialized():  # on loopback only, as the executor's own local Ray
        start_local_ray(num_cpus=max(4, os.cpu_count() or 2), log_to_driver=False)
    yield ray
    ray.shutdown()
