"""Counting and compiling a diffusers denoiser that runs on our kernels.

Modules inside a ``torch.compile`` graph cannot count their own calls (a Python
increment would be traced away or force recompiles), so, as on the native path, each
compiled block's calls are added from a static tally of its ``Linear``/``Attention``
modules, once per denoiser forward: every block of a DiT runs once per forward. Modules
outside the blocks stay eager and count themselves.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from diffserve.layers.attestation import KernelCounters
from diffserve.layers.traced_tally import inventory
from diffserve.logging import get_logger
from diffserve.models.compile_options import CompileOptions

logger = get_logger(__name__)


def count_forwards(
    denoiser: nn.Module,
    counters: KernelCounters,
    computed: Callable[[], bool] = lambda: True,
) -> None:
    """Count every denoiser forward in ``counters.transformer_forwards`` that
    ``computed`` says ran its blocks (a step cache's skipped forward, which ran the
    first block only, does not count, as on the native path)."""
    denoiser.register_forward_hook(
        lambda module, args, output: counters.count_forward() if computed() else None
    )


def compile_denoiser(
    denoiser: nn.Module, counters: KernelCounters, options: CompileOptions
) -> int:
    """``torch.compile`` (lazily, with the device's ``options``:
    ``models/compile_options.py``) every block in the denoiser's block lists; returns
    how many blocks were compiled."""
    blocks = [
        block
        for _, child in denoiser.named_children()
        if isinstance(child, nn.ModuleList)
        for block in child
    ]
    if not blocks:
        logger.warning(
            "%s has no block lists to compile; it runs eager", type(denoiser).__name__
        )
        return 0
    tally: dict[str, dict[str, int]] = {"linear": {}, "attention": {}}
    for block in blocks:
        for kind, calls in inventory(block).items():
            for name, n in calls.items():
                tally[kind][name] = tally[kind].get(name, 0) + n
        block.compile(mode=options.mode, dynamic=options.dynamic)
    denoiser.register_forward_pre_hook(lambda module, args: counters.add(tally))
    logger.info(
        "%d denoiser blocks will be compiled on first use (mode %s, %s shapes)",
        len(blocks),
        options.mode or "default",
        "dynamic" if options.dynamic else "static",
    )
    return len(blocks)
