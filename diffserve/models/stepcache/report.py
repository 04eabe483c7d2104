"""``attestation["cache"]``: one entry per image, saying which steps its transformer
skipped and why.

An entry is ``{backend, threshold, computed_steps, skipped_steps, trace}`` for the
image's prompt branch (and TeaCache's ``coefficients``: the published polynomial's
name); an image with true CFG adds ``negative`` (the same three counts for its
negative-prompt branch, which decides on its own). Under CFG-parallel the negative
branch ran on another rank: the worker attaches that rank's entries with
``attach_negative``.
"""

from __future__ import annotations

from typing import Any

from diffserve.models.stepcache.policy import COMPUTE, BranchCache, CacheSettings
from diffserve.types.attestation import BranchCacheReport, CacheEntry


def image_entries(
    settings: CacheSettings,
    steps: int | list[int],
    rows: list[int],
    positive: BranchCache | None,
    negative: BranchCache | None = None,
    *,
    cfg: bool = False,
) -> list[CacheEntry]:
    """The entries of a batch's image ``rows`` (``steps``: their step count, one for
    all or one per row of ``rows``). A branch of ``None`` ran uncached (every step
    computed: backend none, or threshold 0 for every row); ``cfg`` adds the negative
    branch's counts."""
    entries = []
    for index, row in enumerate(rows):
        total = steps if isinstance(steps, int) else steps[index]
        threshold = positive.threshold(row) if positive is not None else 0.0
        entry = CacheEntry(
            backend=settings.backend,
            threshold=threshold,
            **_branch(positive, row, total),
        )
        if settings.backend == "teacache":
            entry["coefficients"] = settings.polynomial
        if cfg:
            entry["negative"] = _branch(negative, row, total)
        entries.append(entry)
    return entries


def _branch(cache: BranchCache | None, row: int, steps: int) -> BranchCacheReport:
    if cache is None:
        return BranchCacheReport(
            computed_steps=steps,
            skipped_steps=0,
            trace=[[step + 1, None, COMPUTE] for step in range(steps)],
        )
    return cache.report(row)


def attach_negative(
    entries: list[CacheEntry], negative: list[CacheEntry]
) -> list[CacheEntry]:
    """Entries of the prompt branch with the negative branch's counts (from its CFG
    rank) attached."""
    out = []
    for entry, other in zip(entries, negative, strict=True):
        entry = entry.copy()
        entry["negative"] = BranchCacheReport(
            computed_steps=other["computed_steps"],
            skipped_steps=other["skipped_steps"],
            trace=other["trace"],
        )
        out.append(entry)
    return out


def merge_negative_entries(
    outputs: list[Any],
    per_rank: list[list[dict[str, Any]]],
    cfg_size: int,
    ulysses_size: int,
) -> None:
    """CFG-parallel: the negative branch's step-cache decisions were taken on the first
    rank of CFG group 1 (ranks are CFG-major); attach them to rank 0's entries
    (``outputs``: rank 0's ``RequestResult``s), in place. Ulysses ranks decide alike."""
    if cfg_size == 1:
        return
    for output, theirs in zip(outputs, per_rank[ulysses_size], strict=True):
        cache, negative = output.attestation.get("cache"), theirs.get("cache")
        if cache is not None and negative is not None:
            output.attestation["cache"] = attach_negative(cache, negative)
