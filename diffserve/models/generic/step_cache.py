"""First-Block Cache on the generic path: diffusers' own denoiser, its block list
wrapped so that a step whose first-block residual barely moved reuses the other blocks'
cached residual (``models/stepcache``'s rules).

The registry names the block list and how a block hands its streams on
(``FirstBlockCacheSpec``). Each block is wrapped in place and diffusers' forward still
loops over them:
- block 0 runs; the change of its image residual is the probe; every row decides alone
  (``BranchCache``);
- when every row of the forward skips, blocks 1..N-2 pass their inputs through untouched
  and the last one
  returns block 0's output with the cached residual added to the image stream (the text
  stream leaves the loop unused in the families that declare a spec: SD3 and Qwen-Image
  discard it after the last block);
- otherwise every block runs for the whole batch, and rows that skip get block 0's
  output plus their own
  cached residual: a row's result is the one it would have alone (a mixed batch saves
  nothing).
Threshold 0 computes every step through the same blocks: the image is the uncached one,
bit for bit. CFG branches decide apart: a pipeline that runs them as two forwards a step
(Qwen-Image) gets one ``BranchCache`` per forward, one that batches them (SD3: negative
rows first) one cache over both halves. Eager only (config refuses ``enforce_eager:
false`` with it): compiled blocks are counted from a tally per forward, which a skipped
block would falsify.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.report import image_entries
from diffserve.registry.family import FirstBlockCacheSpec
from diffserve.types.attestation import CacheEntry


@dataclass
class _Run:
    """One batch: its settings, the current step and forward within it, each forward's
    branch cache."""

    settings: CacheSettings
    steps: int
    images: int
    step: int = 0
    # within the step: sequential CFG runs the prompt's forward, then the negative
    # prompt's
    forward: int = 0
    rows: list[int] = field(default_factory=list)  # rows of each forward of a step
    branches: list[BranchCache] = field(default_factory=list)
    compute: list[bool] = field(default_factory=list)
    base: tuple[Any, ...] = ()  # block 0's output

    @property
    def active(self) -> bool:
        return self.settings.enabled

    def branch(self) -> BranchCache:
        return self.branches[self.forward]

    def block_zero_ran(self, rows: int) -> None:
        if self.step == 0:
            self.rows.append(rows)
            if self.active:
                cache = BranchCache(self.settings, self.steps)
                cache.add_rows(rows)
                self.branches.append(cache)

    def entries(self) -> list[CacheEntry]:
        """One entry per image: its prompt branch's decisions, and the negative prompt's
        where CFG ran."""
        images = list(range(self.images))
        sequential, batched = len(self.rows) == 2, self.rows[:1] == [2 * self.images]
        positive = negative = None
        if self.active and sequential:
            positive, negative = self.branches
        elif self.active and batched:  # the pipeline's torch.cat([negative, prompt])
            both = self.branches[0]
            positive, negative = (
                _view(both, both.rows[self.images :]),
                _view(both, both.rows[: self.images]),
            )
        elif self.active:
            positive = self.branches[0]
        return image_entries(
            self.settings,
            self.steps,
            images,
            positive,
            negative,
            cfg=sequential or batched,
        )


def _view(branch: BranchCache, rows: list[Any]) -> BranchCache:
    """Some rows of ``branch`` as a cache of their own (for their report)."""
    view = BranchCache(branch.settings, branch.total_steps)
    view.rows = rows
    return view


class _CachedBlock(nn.Module):
    """One block of the list: block 0 decides, the others run or pass through as it
    decided."""

    def __init__(
        self, block: nn.Module, index: int, last: int, owner: GenericStepCache
    ) -> None:
        super().__init__()
        self.block, self.index, self.last = block, index, last
        self._owner = [owner]  # a plain reference, not a submodule

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner[0]
        run = owner.run
        if run is None:
            return self.block(*args, **kwargs)
        image = owner.spec.image_output
        if self.index == 0:
            out = self.block(*args, **kwargs)
            probe = out[image] - kwargs["hidden_states"]
            run.block_zero_ran(probe.shape[0])
            run.compute = [True] * probe.shape[0]
            if run.active:
                run.compute = run.branch().decide([run.step] * probe.shape[0], probe)
            run.base = tuple(out)
            return out
        if not any(run.compute):
            if self.index < self.last:
                return tuple(kwargs[name] for name in owner.spec.block_outputs)
            return _with_image(
                run.base,
                image,
                run.branch().apply(run.compute, run.base[image], _never),
            )
        out = self.block(*args, **kwargs)
        if self.index != self.last or not run.active:
            return out

        def computed(rows: Tensor | None) -> Tensor:
            return out[image] if rows is None else out[image][rows]

        # Refreshes the computing rows' residuals; skipping rows get block 0's output +
        # theirs.
        return _with_image(
            tuple(out),
            image,
            run.branch().apply(run.compute, run.base[image], computed),
        )


def _with_image(outputs: tuple[Any, ...], image: int, value: Tensor) -> tuple[Any, ...]:
    """A block's output tuple with its image stream replaced."""
    return tuple(value if i == image else output for i, output in enumerate(outputs))


def _never(rows: Tensor | None) -> Tensor:
    raise AssertionError("no row computes in a skipped forward")


class GenericStepCache:
    """Wraps the denoiser's block list once; ``start`` / ``next_step`` / ``finish``
    bracket each batch."""

    def __init__(self, denoiser: nn.Module, spec: FirstBlockCacheSpec) -> None:
        self.spec = spec
        self.run: _Run | None = None
        blocks = getattr(denoiser, spec.blocks)
        for i, block in enumerate(list(blocks)):
            blocks[i] = _CachedBlock(block, i, len(blocks) - 1, self)
        denoiser.register_forward_hook(
            lambda module, args, output: self._after_forward()
        )

    def start(self, settings: CacheSettings, steps: int, images: int) -> None:
        """A batch of ``images`` begins (at threshold 0 every step computes, and is
        still reported)."""
        self.run = _Run(settings, steps, images)

    def next_step(self) -> None:
        """The pipeline finished a step (its step callback)."""
        if self.run is not None:
            self.run.step += 1
            self.run.forward = 0

    def finish(self) -> list[CacheEntry]:
        """The batch's entries, one per image."""
        run, self.run = self.run, None
        if run is None:
            raise RuntimeError("finish() without start()")
        return run.entries()

    def abandon(self) -> None:
        """The batch ended early (cancelled or failed): nothing to report."""
        self.run = None

    def forward_computed(self) -> bool:
        """Whether the forward that just ran computed its blocks for some row (False:
        all of them skipped)."""
        return self.run is None or any(self.run.compute)

    def _after_forward(self) -> None:
        if self.run is not None:
            self.run.forward += 1
