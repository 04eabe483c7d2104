"""The process groups of one replica's worker group, built in every rank before the
model loads.

One default (world) group per replica over TCP (``init_method`` from the executor: a
free port on 127.0.0.1 for mp), gloo on CPU and nccl on CUDA, plus one subgroup per
parallel dimension whose size is above 1. Ranks are laid out CFG-major, ``rank =
cfg_rank * ulysses_size + ulysses_rank``: the two CFG branches are two Ulysses groups,
and a CFG group pairs the ranks that hold the same sequence shard. ``new_group`` is
collective (every rank creates every group, in the same order), so each rank builds all
of them and keeps the ones it belongs to.

The group timeout bounds a collective whose peer never arrives (a rank stuck or killed):
the survivor raises instead of waiting forever. The executor also kills the whole group
when one rank dies.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

from diffserve.config.schema import StageConfig
from diffserve.layers.collectives import all_reduce_max
from diffserve.logging import get_logger
from diffserve.models.base import ParallelContext

logger = get_logger(__name__)

__all__ = ["destroy", "free_port", "gather_to_rank0", "init_parallel", "stop_agreed"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the rendezvous of one
    replica's group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def init_parallel(
    stage: StageConfig,
    rank: int,
    device: str,
    init_method: str | None,
    timeout_s: float,
) -> ParallelContext:
    """Join the replica's process group and build the subgroups; one rank needs none of
    it."""
    world = stage.parallel.world_size
    if world == 1:
        return ParallelContext()
    if init_method is None:
        raise RuntimeError(
            f"rank {rank} of a {world}-rank stage was started without "
            "a rendezvous address"
        )
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=world,
        rank=rank,
        timeout=timedelta(seconds=timeout_s),
    )
    cfg_size, ulysses_size = (
        stage.parallel.cfg_parallel_size,
        stage.parallel.ulysses_degree,
    )
    cfg_rank, ulysses_rank = divmod(rank, ulysses_size)
    cfg_group = ulysses_group = None
    if cfg_size > 1:
        for u in range(ulysses_size):
            group = dist.new_group(
                [c * ulysses_size + u for c in range(cfg_size)],
                timeout=timedelta(seconds=timeout_s),
            )
            if u == ulysses_rank:
                cfg_group = group
    if ulysses_size > 1:
        for c in range(cfg_size):
            group = dist.new_group(
                [c * ulysses_size + u for u in range(ulysses_size)],
                timeout=timedelta(seconds=timeout_s),
            )
            if c == cfg_rank:
                ulysses_group = group
    logger.info(
        "rank %d/%d joined %s (%s): cfg %d/%d, ulysses %d/%d",
        rank,
        world,
        init_method,
        backend,
        cfg_rank,
        cfg_size,
        ulysses_rank,
        ulysses_size,
    )
    return ParallelContext(
        rank=rank,
        world_size=world,
        cfg_rank=cfg_rank,
        cfg_size=cfg_size,
        ulysses_rank=ulysses_rank,
        ulysses_size=ulysses_size,
        cfg_group=cfg_group,
        ulysses_group=ulysses_group,
        world_group=dist.group.WORLD,
    )


def stop_agreed(
    parallel: ParallelContext, stop: bool, device: str, counters: Any = None
) -> bool:
    """Whether any rank wants to stop after this step. Every rank must decide the same:
    a rank that stopped alone would leave the others blocked in the next step's
    collective."""
    if not parallel.distributed:
        return stop
    return bool(
        all_reduce_max(int(stop), parallel.world_group, counters, device=device)
    )


def gather_to_rank0(parallel: ParallelContext, value: Any) -> list[Any] | None:
    """Every rank's ``value`` (small, picklable) in rank order on rank 0; ``None`` on
    the others. One ``gather_object`` at the end of a batch: the per-rank counters of
    the attestation."""
    if not parallel.distributed:
        return [value]
    import torch.distributed as dist

    out: list[Any] | None = [None] * parallel.world_size if parallel.rank == 0 else None
    dist.gather_object(value, out, dst=0, group=parallel.world_group)
    return out


def destroy(parallel: ParallelContext) -> None:
    """Leave the process group (worker shutdown); a broken group is not an error
    here."""
    if not parallel.distributed:
        return
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out; the process exits anyway
        logger.debug("destroy_process_group failed", exc_info=True)
