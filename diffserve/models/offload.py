"""Offload for accelerators (``offload: model | sequential``): weights wait in host
memory until they run.

``model`` (component level): every offloaded component lives in host memory and is moved
to the device when one of its entry points is called (``forward``; the VAE's
``encode``/``decode``), the component that ran before it going back to host memory
first, so at most one of them holds device memory at a time besides the denoiser's
resident part. ``sequential`` adds the denoiser's blocks: they stay in pinned host
memory and each is copied to the device just before it runs, the next block's copy
prefetched on a side stream while the current one computes; after a block ran its device
copy is dropped (its weights never change, so nothing is copied back). A LoRA batch's
factors are buffers on the stage's device and stay there. The rest of the denoiser
(embedders, final layer) stays on the device.

Resolve refuses both on a CPU-only stage (``config/device_rules.py``); they are tested
on a GPU (``tests/models/test_offload_gpu.py``, ``make gpu-check``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from diffserve.logging import get_logger

logger = get_logger(__name__)

# The methods through which each kind of component is run (a VAE is called through
# encode/decode, not forward).
ENTRY_POINTS: dict[str, tuple[str, ...]] = {"vae": ("encode", "decode", "forward")}
HOST = torch.device("cpu")


class ModelOffload:
    """Component-level offload: ``components`` move to ``device`` when called and back
    when another one is."""

    def __init__(self, components: dict[str, nn.Module], device: torch.device) -> None:
        self.device = device
        self.components = components
        self.active: str | None = None
        for name, module in components.items():
            module.to(HOST)
            for method in ENTRY_POINTS.get(name, ("forward",)):
                if hasattr(module, method):
                    setattr(module, method, self._wrap(name, getattr(module, method)))
        torch.cuda.empty_cache()

    def _wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.activate(name)
            return call(*args, **kwargs)

        return run

    def activate(self, name: str) -> None:
        """Move ``name`` to the device (the previously active component back to host
        memory first)."""
        if self.active == name:
            return
        if self.active is not None:
            self.components[self.active].to(HOST)
        self.components[name].to(self.device)
        self.active = name


class BlockOffload:
    """Block-level offload of ``blocks`` (run in order, every step): pinned host copies,
    one block's weights on the device at a time plus the next one's prefetch."""

    def __init__(self, blocks: Sequence[nn.Module], device: torch.device) -> None:
        self.blocks = list(blocks)
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.ready: dict[int, torch.cuda.Event] = {}
        self.host: list[list[torch.Tensor]] = []
        for index, block in enumerate(self.blocks):
            tensors = self._tensors(block)
            self.host.append([self._pinned(t) for t in tensors])
            for tensor, host in zip(tensors, self.host[index], strict=True):
                tensor.data = host
            block.register_forward_pre_hook(functools.partial(self._before, index))
            block.register_forward_hook(functools.partial(self._after, index))
        torch.cuda.empty_cache()

    @staticmethod
    def _tensors(block: nn.Module) -> list[torch.Tensor]:
        # Parameters only: buffers (a LoRA batch's factors, set per batch on the stage's
        # device) stay put.
        return list(block.parameters())

    @staticmethod
    def _pinned(tensor: torch.Tensor) -> torch.Tensor:
        host = tensor.detach().to(HOST)
        try:
            return host.pin_memory()
        except (
            RuntimeError,
            NotImplementedError,
        ):  # a tensor subclass without pinned storage: pageable
            return host

    def _prefetch(self, index: int) -> None:
        """Start copying block ``index`` to the device on the side stream."""
        if index in self.ready:
            return
        with torch.cuda.stream(self.stream):
            for tensor, host in zip(
                self._tensors(self.blocks[index]), self.host[index], strict=True
            ):
                tensor.data = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.ready[index] = event

    def _before(self, index: int, module: nn.Module, args: Any) -> None:
        self._prefetch(index)
        current = torch.cuda.current_stream(self.device)
        current.wait_event(self.ready.pop(index))
        for tensor in self._tensors(module):
            # Allocated on the copy stream, used on this one.
            tensor.data.record_stream(current)
        # The next block (the first one again for the next step)
        self._prefetch((index + 1) % len(self.blocks))

    def _after(self, index: int, module: nn.Module, args: Any, output: Any) -> None:
        for tensor, host in zip(self._tensors(module), self.host[index], strict=True):
            tensor.data = host


def offload_native(
    mode: str,
    *,
    denoiser_blocks: Sequence[nn.Module],
    components: dict[str, nn.Module],
    device: torch.device,
) -> ModelOffload | None:
    """Install ``mode`` (``none`` | ``model`` | ``sequential``) on a native pipeline's
    components."""
    if mode == "none":
        return None
    offload = ModelOffload(components, device)
    if mode == "sequential":
        BlockOffload(denoiser_blocks, device)
    logger.info(
        "offload %s: %s in host memory until called%s",
        mode,
        ", ".join(components),
        f"; {len(denoiser_blocks)} denoiser blocks prefetched one at a time"
        if mode == "sequential"
        else "",
    )
    return offload


def offload_diffusers(mode: str, pipe: Any, device: torch.device) -> None:
    """The generic path: diffusers' own offload (accelerate's hooks) for ``model`` and
    ``sequential``."""
    if mode == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif mode == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
