"""The groups of a step-level batch: rows of one ``group_key`` (latent shape, frames,
edit inputs) share every transformer call; a batch holds one group per shape it runs,
and each step runs them back to back (what varies per row inside a group, its step,
schedule, cache slot and adapters, never changes a tensor's shape)."""

from __future__ import annotations

from dataclasses import dataclass

from diffserve.models.runner.branches import BranchCaches
from diffserve.models.runner.rows import LiveRows
from diffserve.types.batching import BatchPlan, GroupKey, group_key
from diffserve.types.request import GenerationRequest


@dataclass
class Group:
    """One shape's rows: its plan (size, frames, guidance, text window), its rows and
    one step cache per CFG branch."""

    plan: BatchPlan
    live: LiveRows
    caches: BranchCaches


def by_group(
    requests: list[GenerationRequest],
) -> dict[GroupKey, list[GenerationRequest]]:
    """``requests`` by group key, in arrival order within each."""
    groups: dict[GroupKey, list[GenerationRequest]] = {}
    for request in requests:
        groups.setdefault(group_key(request), []).append(request)
    return groups
