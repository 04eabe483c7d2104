"""Where a replica's ranks go on a Ray cluster: one placement group per replica, its
ranks packed on one node, the replicas spread over the nodes.

* Ranks: the group has one bundle per rank and strategy ``STRICT_PACK``: every rank of a
  replica runs on one
  node or the group is not placed at all. A parallel group's collectives (all-to-all
  every step) then never cross the network, and losing a node loses whole replicas,
  never half of one.
* Replicas: before a group is made, the node for it is chosen: among the alive nodes
  with room for all its
  bundles (free resources now), the one with the fewest diffserve groups on it (placed
  groups from the cluster's table, any driver's, plus the groups this process has asked
  for and Ray has not placed yet); ties go to the node with the most of the bundle's
  resource free, then to the lowest node id. The group asks Ray for that node with
  ``_soft_target_node_id`` (Ray 2.60, ``STRICT_PACK`` only; Ray Serve's spread uses it
  too): a hint, so if the node fills up or dies before the group is placed, Ray places
  it on another node instead of failing. On one node, or when no node has room now, no
  node is named and Ray places the group where it can (every single-node deployment
  behaves as before).
* Races: replicas are built from several threads at once (``engine/replicas.py``).
  Choosing a node and
  asking for the group happen under one lock, and a requested group counts on its node
  until Ray reports it placed, so two replicas of one process never pick the same node
  for lack of seeing each other. Engines in different processes see each other's groups
  once Ray has placed them.
"""

from __future__ import annotations

import threading

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)

from diffserve.logging import get_logger

logger = get_logger(__name__)

# every placement group diffserve makes is named so (and counted by it)
GROUP_PREFIX = "diffserve-"
_STRATEGY = "STRICT_PACK"

_choose_lock = threading.Lock()
# Groups this process asked for that Ray has not placed yet: placement group id (hex) ->
# the node asked for.
_requested: dict[str, str] = {}


def place_replica(
    bundle: dict[str, float], world_size: int, name: str, timeout: float
) -> tuple[PlacementGroup, bool]:
    """Make a replica's placement group (``world_size`` copies of ``bundle``, one node)
    on the node the policy picks; returns it and whether Ray placed it within
    ``timeout`` seconds. ``name`` must start with ``GROUP_PREFIX``."""
    with _choose_lock:
        try:
            target = choose_node(bundle, world_size)
        except Exception as exc:  # noqa: BLE001 - the spread is best effort (e.g. Ray Client has no GCS tables)
            logger.warning(
                "ray executor: cannot read the cluster's nodes and "
                "groups (%s); Ray places %s",
                exc,
                name,
            )
            target = None
        group = placement_group(
            [dict(bundle) for _ in range(world_size)],
            strategy=_STRATEGY,
            name=name,
            _soft_target_node_id=target,
        )
        if target is not None:
            _requested[group.id.hex()] = target
    logger.info(
        "ray executor: placement group %s (%d x %s, %s) asked for on node %s",
        name,
        world_size,
        bundle,
        _STRATEGY,
        target[:12] if target else "(any: Ray's choice)",
    )
    try:
        return group, bool(group.wait(timeout))
    except BaseException:
        remove_placement_group(group)  # the caller never gets it to remove
        raise
    finally:
        with _choose_lock:
            _requested.pop(group.id.hex(), None)


def choose_node(bundle: dict[str, float], world_size: int) -> str | None:
    """The node (hex id) a new replica's group should go to, or None to let Ray choose
    (see the module doc)."""
    alive = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    if len(alive) < 2:
        return None
    free = _free_per_node()
    need = {resource: amount * world_size for resource, amount in bundle.items()}
    roomy = [
        node
        for node in alive
        if all(free.get(node, {}).get(r, 0.0) >= n for r, n in need.items())
    ]
    if not roomy:
        return None  # nothing fits now: Ray waits for room wherever it comes
    groups = groups_per_node()
    main = next(iter(bundle))  # CPU or GPU: the resource a rank is placed by
    return min(
        roomy, key=lambda node: (groups.get(node, 0), -free[node].get(main, 0.0), node)
    )


def groups_per_node() -> dict[str, int]:
    """How many diffserve placement groups each node holds (a group counts once per node
    it is on): the placed ones from the cluster's table, and the ones this process asked
    for that are not placed yet."""
    nodes_of: dict[str, set[str]] = {}
    for group_id, entry in ray.util.placement_group_table().items():
        if (
            entry.get("name", "").startswith(GROUP_PREFIX)
            and entry.get("state") == "CREATED"
        ):
            nodes_of[group_id] = set(entry.get("bundles_to_node_id", {}).values())
    for group_id, node in _requested.items():
        nodes_of.setdefault(group_id, {node})
    counts: dict[str, int] = {}
    for nodes in nodes_of.values():
        for node in nodes:
            counts[node] = counts.get(node, 0) + 1
    return counts


def _free_per_node() -> dict[str, dict[str, float]]:
    # Ray's DeveloperAPI, no dashboard needed.
    from ray._private.state import available_resources_per_node

    return dict(available_resources_per_node())


def describe_free() -> str:
    """Each alive node's free resources of the kinds a rank asks for (for a placement
    that timed out)."""
    try:
        free = _free_per_node()
    except Exception:  # noqa: BLE001 - only for an error message: the cluster's totals are enough then
        return f"the cluster has {ray.available_resources()} free"
    parts = [
        f"{node[:12]}: "
        + ", ".join(f"{r}={v:g}" for r, v in sorted(res.items()) if r in ("CPU", "GPU"))
        for node, res in sorted(free.items())
    ]
    return "free per node: " + "; ".join(parts)
