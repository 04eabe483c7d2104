"""Real ``diffserve serve`` processes on 127.0.0.1 for the adversarial suite, and the
probes the tests read from them (RSS, fds, threads, metrics). Fixtures from
tests/entrypoints/conftest.py are not visible here, so the servers are started with
``server_process.ServerProcess`` directly.

Soak tests (``@pytest.mark.slow``) in this directory run only when asked for: ``-m
slow`` or ``DIFFSERVE_SOAK=1``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from adversarial_helpers import (
    API_KEY,
    BUSY_DEPLOY,
    HARDENED_DEPLOY,
    MODEL_NAME,
    launch,
    write,
)
from server_process import ServerProcess


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if os.environ.get("DIFFSERVE_SOAK") == "1" or "slow" in (
        config.option.markexpr or ""
    ):
        return
    skip = pytest.mark.skip(reason="soak test: run with -m slow or DIFFSERVE_SOAK=1")
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("slow") and here in Path(str(item.path)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def hardened_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_flux_dir: Path
) -> Iterator[ServerProcess]:
    """The key comes from DIFFSERVE_API_KEY (not the command line)."""
    tmp = tmp_path_factory.mktemp("hardened")
    with launch(
        tmp,
        tiny_flux_dir,
        "--deploy-config",
        write(tmp, HARDENED_DEPLOY),
        "--served-model-name",
        MODEL_NAME,
        "--default-steps",
        "2",
        env={"DIFFSERVE_API_KEY": API_KEY},
    ) as server:
        yield server


@pytest.fixture(scope="session")
def busy_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_flux_dir: Path
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("busy")
    with launch(
        tmp,
        tiny_flux_dir,
        "--deploy-config",
        write(tmp, BUSY_DEPLOY),
        "--served-model-name",
        MODEL_NAME,
        "--api-key",
        API_KEY,
        "--default-steps",
        "2",
    ) as server:
        yield server
