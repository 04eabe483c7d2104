"""One Wan velocity call over the rows of a step-level batch, each row through the
expert its own request's schedule picked for its step.

Requests join at any step boundary, so on Wan2.2 one step may hold rows before the
boundary (high-noise ``transformer``) and rows after it (low-noise ``transformer_2``):
each expert then runs on its own rows and the results go back in row order, every row
through its own step-cache slot. When every row has one expert (always on Wan2.1) this
is one call over the whole batch, op for op the call of a batch without joins."""

from __future__ import annotations

import torch
from torch import Tensor

from diffserve.models.runner import LiveRows
from diffserve.models.stepcache.policy import BranchCache
from diffserve.models.wan.experts import Experts
from diffserve.models.wan.step_cache import cached_forward
from diffserve.models.wan.transformer import WanTransformer


def rows_by_expert(rows: LiveRows) -> dict[str, list[int]]:
    """The rows each expert runs at this step, in row order."""
    routes: dict[str, list[int]] = {}
    for member in rows.members:
        name = member.schedule.expert(rows.step_of(member))
        routes.setdefault(name, []).extend(member.rows)
    return routes


def routed_velocity(
    experts: Experts,
    model_input: Tensor,
    timesteps: Tensor,
    text: Tensor,
    rows: LiveRows,
    cache: BranchCache | None,
    teacache_probe: str | None,
) -> Tensor:
    """Every row's velocity, each from its step's expert (``timesteps``: one per
    row)."""
    routes = rows_by_expert(rows)
    if len(routes) == 1:
        (name,) = routes
        return _forward(
            experts.transformers[name],
            model_input,
            timesteps,
            text,
            rows,
            rows.steps,
            cache,
            teacache_probe,
        )
    out: Tensor | None = None
    for name, picked in routes.items():
        index = _index(picked, model_input.device)
        part = _forward(
            experts.transformers[name],
            model_input.index_select(0, index),
            timesteps.index_select(0, index),
            text.index_select(0, index),
            rows,
            [rows.steps[row] for row in picked],
            None if cache is None else cache.view(picked),
            teacache_probe,
        )
        if out is None:
            out = part.new_empty((model_input.shape[0], *part.shape[1:]))
        out.index_copy_(0, index, part)
    assert out is not None  # some rows ran
    return out


def _index(rows: list[int], device: torch.device) -> Tensor:
    """``rows`` as an index tensor on ``device``, copied without blocking (a plain
    ``torch.tensor(rows, device=cuda)`` waits for every queued kernel)."""
    index = torch.tensor(rows)
    if device.type == "cuda":
        return index.pin_memory().to(device, non_blocking=True)
    return index


def _forward(
    transformer: WanTransformer,
    model_input: Tensor,
    timesteps: Tensor,
    text: Tensor,
    rows: LiveRows,
    steps: list[int],
    cache: BranchCache | None,
    teacache_probe: str | None,
) -> Tensor:
    # A part of the batch whose rows all have threshold 0 never skips: the plain
    # forward, as each of those requests would run alone.
    if cache is None or not cache.active:
        return transformer(model_input, timesteps, text, rows.shared)
    return cached_forward(
        transformer,
        cache,
        steps,
        model_input,
        timesteps,
        text,
        rows.shared,
        teacache_probe,
    )
