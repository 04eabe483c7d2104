"""The rows of one group of a running (step-level) batch: who is in it, at which step,
and their tensors.

Requests join at a step boundary and leave when their last step is done, so the rows of
one forward may sit at different steps, each of its own request's schedule: every row
carries its own step index, every member its own ``Schedule``. Tensors are kept batched
and rebuilt only when rows join or leave; a family's per-row values (text states per
CFG branch, an edit's inputs) may be tensors, tuples or dataclasses of tensors, joined
and sliced alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from diffserve.models.runner.hooks import Prepared, Schedule
from diffserve.types.request import GenerationRequest


@dataclass
class Member:
    """One request of the batch: its first row, its image count, its schedule and when
    it joined."""

    request: GenerationRequest
    first_row: int
    schedule: Any  # the family's Schedule for this request
    joined: float = field(default_factory=time.perf_counter)
    encode_ms: float = 0.0
    start_step: int = 0  # an edit of strength < 1 starts into its schedule

    @property
    def rows(self) -> range:
        return range(self.first_row, self.first_row + self.request.n)

    @property
    def span(self) -> slice:
        return slice(self.first_row, self.first_row + self.request.n)


@dataclass
class LiveRows:
    """Members in join order, one step index per row, and the batched per-row values."""

    members: list[Member] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    latents: Tensor | None = None
    texts: list[Any] = field(default_factory=list)  # one per CFG branch this rank runs
    extras: Any = None
    shared: Any = None

    @property
    def rows(self) -> int:
        return len(self.steps)

    def add(
        self,
        requests: list[GenerationRequest],
        prepared: Prepared,
        texts: list[Any],
        encode_ms: float,
        schedules: list[Schedule],
    ) -> None:
        for request, schedule in zip(requests, schedules, strict=True):
            self.members.append(
                Member(
                    request,
                    self.rows,
                    schedule,
                    encode_ms=encode_ms,
                    start_step=prepared.start_step,
                )
            )
            self.steps += [prepared.start_step] * request.n
        if self.latents is None:
            self.latents, self.texts, self.extras = (
                prepared.latents,
                texts,
                prepared.extras,
            )
            self.shared = prepared.shared
            return
        self.latents = torch.cat((self.latents, prepared.latents))
        self.texts = [
            _join(mine, theirs) for mine, theirs in zip(self.texts, texts, strict=True)
        ]
        self.extras = _join(self.extras, prepared.extras)

    def finished(self) -> list[Member]:
        """Members whose last step is done."""
        return [m for m in self.members if self.steps[m.first_row] >= m.schedule.steps]

    def step_of(self, member: Member) -> int:
        return self.steps[member.first_row]

    def per_row(self, value: Callable[[Member, int], Tensor]) -> Tensor:
        """One value per row: ``value(member, its step)`` (a 0-d tensor) repeated over
        the member's images, concatenated in row order (every row at its own step of
        its own schedule)."""
        parts = [
            value(m, self.steps[m.first_row]).expand(m.request.n) for m in self.members
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def per_member(self, run: Callable[[Member, slice, int], Tensor]) -> Tensor:
        """``run(member, its rows, its step)`` for every member, the results joined
        back in row order (a schedule steps its own request's rows)."""
        parts = [run(m, m.span, self.steps[m.first_row]) for m in self.members]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def drop(self, leaving: list[Member]) -> list[int]:
        """Remove ``leaving`` members; returns the rows that stay (old indices, in
        order)."""
        gone = {id(m) for m in leaving}
        keep = [row for m in self.members if id(m) not in gone for row in m.rows]
        staying = [m for m in self.members if id(m) not in gone]
        first = 0
        for member in staying:
            member.first_row, first = first, first + member.request.n
        self.members = staying
        self.steps = [self.steps[row] for row in keep]
        if self.latents is not None and keep:
            index = torch.tensor(keep, device=self.latents.device)
            self.latents = self.latents.index_select(0, index)
            self.texts = [_select(text, index) for text in self.texts]
            self.extras = _select(self.extras, index)
        return keep

    def progress(self) -> tuple[tuple[str, int], ...]:
        """``(request_id, steps done)`` of every member."""
        return tuple(
            (m.request.request_id, self.steps[m.first_row]) for m in self.members
        )


def _join(mine: Any, theirs: Any) -> Any:
    if isinstance(mine, Tensor):
        return torch.cat((mine, theirs))
    if isinstance(mine, tuple):
        return tuple(_join(a, b) for a, b in zip(mine, theirs, strict=True))
    if dataclasses.is_dataclass(mine) and not isinstance(mine, type):
        return dataclasses.replace(
            mine,
            **{
                f.name: _join(getattr(mine, f.name), getattr(theirs, f.name))
                for f in dataclasses.fields(mine)
            },
        )
    return mine  # None or a value every row shares


def _select(value: Any, index: Tensor) -> Any:
    if isinstance(value, Tensor):
        return value.index_select(0, index)
    if isinstance(value, tuple):
        return tuple(_select(v, index) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value,
            **{
                f.name: _select(getattr(value, f.name), index)
                for f in dataclasses.fields(value)
            },
        )
    return value
