"""Memory you can read: the bytes each loaded component's weights take on its device,
and the peak memory of each phase of a batch (``RequestResult.memory_peak_mib``).

Weight bytes count what the tensors hold, not what they would hold unquantized: a
torchao tensor subclass (``Int8Tensor``: int8 data plus scales) is measured through its
inner tensors, a GGUF layer's packed blocks as stored. Peaks are the device's:
``torch.cuda.max_memory_allocated`` on CUDA (reset at each phase), the process's peak
resident set on CPU (``VmHWM``, reset through ``/proc/self/clear_refs`` where Linux
allows it; it includes everything else the process holds).
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from diffserve.types.attestation import QuantizationReport
from diffserve.types.memory import ComponentWeights

MIB = 2**20


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes ``tensor`` holds: a wrapper subclass's inner tensors (data, scales), else
    numel x element size."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def module_weight_bytes(module: nn.Module) -> tuple[int, int]:
    """(bytes, parameters) of ``module``'s parameters and persistent buffers, each
    tensor counted once; a packed GGUF weight (``layers/linear/gguf.py``) by its stored
    bytes."""
    from diffserve.layers.linear.gguf import QuantizedWeight

    seen: set[int] = set()
    total = params = 0
    for tensor in (*module.parameters(), *module.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor_bytes(tensor)
            params += tensor.numel()
    for layer in module.modules():
        weight = layer.__dict__.get("weight")
        if isinstance(weight, QuantizedWeight) and id(weight) not in seen:
            seen.add(id(weight))
            total += weight.nbytes
            params += weight.out_features * weight.in_features
    return total, params


def component_weights(
    name: str, module: nn.Module, *, quantization: QuantizationReport | None = None
) -> ComponentWeights:
    """The report of one loaded component (its device and dtype from its first floating
    parameter)."""
    total, params = module_weight_bytes(module)
    first = next((p for p in module.parameters() if p.is_floating_point()), None)
    return ComponentWeights(
        name=name,
        device=str(first.device) if first is not None else "",
        dtype=str(first.dtype).removeprefix("torch.") if first is not None else "",
        bytes=total,
        parameters=params,
        quantization=quantization,
    )


class PhasePeaks:
    """The peak memory of consecutive phases of one batch on ``device``, in MiB:
    ``start(phase)`` resets the peak, ``stop()`` records it under the phase
    (``peaks``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peaks: dict[str, float] = {}
        self._phase: str | None = None

    def start(self, phase: str) -> None:
        self._phase = phase
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_peak_rss()

    def stop(self) -> None:
        if self._phase is None:
            return
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / MIB
        else:
            peak = peak_rss_bytes() / MIB
        self.peaks[self._phase] = round(max(peak, self.peaks.get(self._phase, 0.0)), 1)
        self._phase = None


def peak_rss_bytes() -> int:
    """This process's peak resident set (``VmHWM``); 0 where /proc is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> None:
    # "5" resets VmHWM to the current RSS (Linux >= 4.0); elsewhere the peak is the
    # process's since start.
    try:
        fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, b"5")
    except OSError:
        pass
    finally:
        os.close(fd)
