"""Joining Ray from a driver: an existing cluster by address, or a local Ray started on
127.0.0.1 only (no node reachable from outside), in single-machine mode when the
bootstrap address is the loopback one."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import ray

from diffserve.logging import get_logger

logger = get_logger(__name__)

LOOPBACK = "127.0.0.1"

_init_lock = threading.Lock()


def connect(address: str, **local_options: Any) -> None:
    """Make sure this process is connected to Ray (``ray_address``, see the module doc).
    ``local_options`` go to ``start_local_ray`` when ``address`` is ``""`` and Ray is
    started here (a test session asks for more logical CPUs than the machine's; the
    executor passes none)."""
    # Replicas may be built from several threads; Ray is initialized once.
    with _init_lock:
        if ray.is_initialized():
            if address:
                logger.info(
                    "ray executor: Ray is already initialized in this process; "
                    "reusing it "
                    "(ray_address %r not consulted)",
                    address,
                )
            return
        if address:
            logger.info("ray executor: joining the Ray cluster at %s", address)
            join_cluster(address)
            return
        local_options.setdefault("num_cpus", os.cpu_count() or 1)
        logger.info(
            "ray executor: starting a local Ray with %d CPU(s) on %s",
            local_options["num_cpus"],
            LOOPBACK,
        )
        start_local_ray(**local_options)


def start_local_ray(**options: Any) -> None:
    """Start a one-machine Ray whose every node address is ``127.0.0.1`` (GCS, raylet,
    workers, and so the process groups' rendezvous), so none of its traffic leaves
    loopback.

    Ray turns a ``127.0.0.1`` node address into the machine's routable one (its
    multi-node mode, on by default on Linux); its single-machine mode (the default on
    macOS and Windows) keeps loopback. That mode is switched on for the start only. The
    driver's import path goes to the actors, so a worker extension importable here (a
    test module, a script's directory) imports there exactly as in an mp worker.
    ``options`` go to ``ray.init`` (``num_cpus``, ``log_to_driver``...)."""
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
    options.setdefault("include_dashboard", False)
    options.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": path}})
    with single_machine_mode():
        ray.init(address="local", _node_ip_address=LOOPBACK, **options)


def join_cluster(address: str) -> None:
    """``ray.init(address=address)``; on a cluster whose head listens on loopback (every
    node started with ``--node-ip-address=127.0.0.1``: a test cluster, or one kept off
    the network) this driver joins as ``127.0.0.1`` too. Ray would otherwise rewrite
    ``127.0.0.1``, in the address and as this driver's own address, to the machine's
    routable IP, where nothing of that cluster listens."""
    if bootstrap_is_loopback(address):
        with single_machine_mode():
            ray.init(address=address, _node_ip_address=LOOPBACK)
    else:
        ray.init(address=address)


def bootstrap_is_loopback(address: str) -> bool:
    """Whether the GCS that ``address`` names (``auto``: ``RAY_ADDRESS``, else the
    cluster ``ray start`` started last on this machine) is on a loopback address. A Ray
    Client address (``ray://``) never is: the driver then runs on the cluster."""
    import ipaddress

    from ray._private.services import get_ray_address_from_environment

    if address.startswith("ray://"):
        return False
    if address == "auto":
        try:
            address = get_ray_address_from_environment("auto", None) or ""
        except Exception:  # noqa: BLE001 - no cluster found: ray.init says so in its own words
            return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def single_machine_mode() -> Iterator[None]:
    """Ray's single-machine mode (the default on macOS and Windows) for one
    ``ray.init``: it keeps ``127.0.0.1`` as the node address instead of replacing it
    with the machine's routable IP."""
    import ray._private.ray_constants as ray_constants

    multi_node = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = multi_node
