"""The rows of a running (step-level) batch: who is in it, at which step, and their tensors.

Requests of one batch key join at a step boundary and leave when their last step is done, so the rows of
one forward may sit at different steps of the same schedule: every row carries its own step index (and so
its own timestep and sigmas). Tensors are kept batched and rebuilt only when rows join or leave.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from diffserve.types.request import GenerationRequest


@dataclass
class Member:
    """One request of the batch: its first row, its image count and when it joined."""

    request: GenerationRequest
    first_row: int
    joined: float = field(default_factory=time.perf_counter)
    encode_ms: float = 0.0

    @property
    def rows(self) -> range:
        return range(self.first_row, self.first_row + self.request.n)


@dataclass
class LiveBatch:
    """Members in join order, one step index per row, the batched latents and conditioning."""

    members: list[Member] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    latents: Tensor | None = None
    cond: Any = None  # the batch's conditioning.Conditioning (text states, pooled vectors, CFG fields)

    @property
    def rows(self) -> int:
        return len(self.steps)

    def add(self, requests: list[GenerationRequest], latents: Tensor, cond: Any, encode_ms: float,
            start: int = 0) -> None:
        """Append ``requests`` (their rows start at step ``start``: an edit skips the schedule's first steps)
        with their latents and conditioning."""
        for request in requests:
            self.members.append(Member(request, self.rows, encode_ms=encode_ms))
            self.steps += [start] * request.n
        if self.latents is None:
            self.latents, self.cond = latents, cond
            return
        self.latents = torch.cat((self.latents, latents))
        for f in fields(cond):
            mine, theirs = getattr(self.cond, f.name), getattr(cond, f.name)
            if isinstance(mine, Tensor) and f.name != "pe":  # pe: one table for every row of the key
                setattr(self.cond, f.name, torch.cat((mine, theirs)))

    def finished(self, total_steps: int) -> list[Member]:
        return [m for m in self.members if self.steps[m.first_row] >= total_steps]

    def drop(self, leaving: list[Member]) -> list[int]:
        """Remove ``leaving`` members; returns the rows that stay (old indices, in order)."""
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
            for f in fields(self.cond):
                value = getattr(self.cond, f.name)
                if isinstance(value, Tensor) and f.name != "pe":
                    setattr(self.cond, f.name, value.index_select(0, index))
        return keep

    def progress(self) -> tuple[tuple[str, int], ...]:
        """``(request_id, steps done)`` of every member."""
        return tuple((m.request.request_id, self.steps[m.first_row]) for m in self.members)
