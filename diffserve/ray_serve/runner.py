"""``diffserve serve --ray-serve``: Ray (started here, or joined), Serve's HTTP proxy on
``--host``/``--port``, the application run until SIGINT or SIGTERM, then stopped.

* Ray: the first model's ``ray_address``. ``""`` starts a local Ray on 127.0.0.1
  (``start_local_ray``) with at
  least one CPU per replica ``max_replicas`` allows (Ray's CPUs are a count, not cores:
  replicas beyond the cores share them, which the operator asked for with max_replicas);
  an address joins that cluster (``connect``).
* Stop: a Ray started here is stopped with Serve (``serve.shutdown``: replicas finish
  their requests, then their
  lifespans stop the engines; then ``ray.shutdown`` ends the local Ray's processes). On
  a joined cluster only this application is deleted; Serve and the cluster stay for
  their other users.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from types import FrameType

from diffserve.config.requirements import module_available
from diffserve.entrypoints.openai.served import ModelServing
from diffserve.errors import ConfigError, EngineDeadError
from diffserve.logging import get_logger
from diffserve.ray_serve.spec import APP_NAME, ReplicaSpec, replica_spec

logger = get_logger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Stopped(BaseException):
    """Raised in the main thread by a stop signal. A BaseException (as KeyboardInterrupt
    is), so no ``except Exception`` inside Ray's wait loops swallows it while the
    application deploys."""


def run_ray_serve(
    models: Sequence[ModelServing],
    *,
    api_key: str | None,
    image_ttl_s: float,
    host: str,
    port: int,
) -> int:
    if not module_available("ray.serve"):
        raise ConfigError(
            "--ray-serve needs Ray Serve, which is not installed",
            path="--ray-serve",
            hint='pip install "diffserve[ray]" (ray[serve]), or serve '
            "without --ray-serve",
        )
    import ray

    spec = replica_spec(models, api_key=api_key, image_ttl_s=image_ttl_s)
    config = spec.models[0].config
    # Decided before anything starts, so a signal during Ray's own start still stops
    # what was started.
    local = not ray.is_initialized() and not config.ray_address
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in _STOP_SIGNALS}
    try:
        _connect(spec, local)
        # Again: ray.init installs Ray's own SIGTERM handler in this process, which logs
        # a stack and ends the process at once (the local Ray's processes are left to
        # die on their own, its agents outlive it).
        for sig in _STOP_SIGNALS:
            signal.signal(sig, _raise_stopped)
        _serve(spec, host, port)
        # until a signal: the proxy and the replicas are Ray actors, nothing to do here
        while True:
            signal.pause()
    except _Stopped as stop:
        logger.info("ray serve: %s received; stopping", stop)
    finally:
        # A second signal while stopping would leave Ray's processes behind: the stop is
        # bounded, let it end.
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        _stop(local)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def _connect(spec: ReplicaSpec, local: bool) -> None:
    """Join ``ray_address``'s cluster, or start a local Ray (``local``); a Ray this
    process already runs is used."""
    import ray

    from diffserve.executor.ray_connect import connect, start_local_ray

    config = spec.models[0].config
    if not local:
        connect(config.ray_address)  # a no-op when this process already initialized Ray
        return
    cpus = max(os.cpu_count() or 1, config.server.autoscaling.max_replicas)
    logger.info("ray serve: starting a local Ray with %d CPU(s) on 127.0.0.1", cpus)
    # Every worker of this Ray at the default niceness, not Ray's 15: Serve's proxy and
    # controller are on each request's path, and at 15 a busy process beside them (a
    # replica's denoiser, another job) starves them.
    start_local_ray(num_cpus=cpus, _system_config={"worker_niceness": 0})
    assert ray.is_initialized()


def _serve(spec: ReplicaSpec, host: str, port: int) -> None:
    from ray import serve

    from diffserve.ray_serve.deployment import build_application

    serve.start(http_options={"host": host, "port": port})
    autoscaling = spec.models[0].config.server.autoscaling
    logger.info(
        "ray serve: deploying %s: %d to %d replica(s), each "
        "a whole engine; the first loads its model "
        "before the proxy routes to it",
        ", ".join(repr(m.name) for m in spec.models),
        autoscaling.min_replicas,
        autoscaling.max_replicas,
    )
    # Returns once the application is RUNNING: every initial replica has loaded its
    # models and is ready.
    try:
        serve.run(
            build_application(spec), name=APP_NAME, route_prefix="/", blocking=False
        )
    except (
        RuntimeError
    ) as exc:  # Serve gave up on the replicas (a model that does not load, ...)
        first_line = (
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        raise EngineDeadError(
            f"Ray Serve could not start the application: {first_line} "
            "(the replicas' log lines "
            "above say why)"
        ) from exc
    logger.info(
        "serving %s at http://%s:%d through Ray Serve (GET "
        "/ray-serve/status: the replicas)",
        ", ".join(repr(m.name) for m in spec.models),
        host,
        port,
    )


def _stop(local: bool) -> None:
    import ray
    from ray import serve

    try:
        if local and ray.is_initialized():
            serve.shutdown()
        elif not local:
            serve.delete(APP_NAME)
    except Exception as exc:  # noqa: BLE001 - Ray itself still has to go; the failure is reported
        logger.error(
            "ray serve: stopping the application failed: %s: %s",
            type(exc).__name__,
            exc,
        )
    finally:
        if local:
            ray.shutdown()
    logger.info("ray serve: stopped")
