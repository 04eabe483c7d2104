"""GGUF-quantized weights kept packed in memory and dequantized per call, around the
stage's own GEMM.

A ``QuantizedWeight`` holds a GGUF tensor's raw blocks (``uint8 [out, bytes per row]``:
ggml quantizes along the input dimension, 32 values per block, so every output row is
its own run of blocks). ``install`` puts one in a ``Linear`` in place of its weight and
wraps the layer's backend in ``GGUFLinearBackend``, which dequantizes to the
activation's dtype and calls the wrapped backend: the memory is the file's, the GEMM is
the stage's, and the call is counted as ``gguf_<type>`` (e.g. ``gguf_q8_0``).

Dequantization follows ggml's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and F16/BF16
kept half) in torch; other types that the ``gguf`` package reads (the K-quants) stay
packed too and are dequantized per call by its numpy code on the CPU (correct, not
fast).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from diffserve.layers.linear.base import LinearBackend
from diffserve.layers.linear.module import Linear

# ggml type name -> (bytes per block of 32 values, dequantize(blocks [..., n_blocks,
# block bytes]) -> float32)
BLOCK_VALUES = 32


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    return blocks[..., start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: the low nibbles are values 0-15, the high nibbles 16-31
    (ggml's order)."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1).to(torch.int16)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (little-endian uint32) -> the 32 values' fifth bits."""
    bits = qh.to(torch.int32)
    word = (
        bits[..., 0] | (bits[..., 1] << 8) | (bits[..., 2] << 16) | (bits[..., 3] << 24)
    )
    shifts = torch.arange(BLOCK_VALUES, device=qh.device, dtype=torch.int32)
    return ((word.unsqueeze(-1) >> shifts) & 1).to(torch.int16)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * b[..., 2:34].contiguous().view(torch.int8).float()


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * (_nibbles(b[..., 2:18]) - 8).float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * _nibbles(b[..., 4:20]).float() + _half(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[..., 6:22]) | (_fifth_bits(b[..., 2:6]) << 4)
    return _half(b, 0) * (q - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[..., 8:24]) | (_fifth_bits(b[..., 4:8]) << 4)
    return _half(b, 0) * q.float() + _half(b, 2)


def _f16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float16).float()


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.bfloat16).float()


BLOCK_FORMATS: dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {
    "q8_0": (34, _q8_0),
    "q4_0": (18, _q4_0),
    "q4_1": (20, _q4_1),
    "q5_0": (22, _q5_0),
    "q5_1": (24, _q5_1),
    # Half-precision tensors stay half in memory too (the stage may compute in float32).
    "f16": (64, _f16),
    "bf16": (64, _bf16),
}


@dataclass
class QuantizedWeight:
    """A packed ``[out, in]`` weight: ``data`` is ``uint8 [out, in / 32 * block
    bytes]``."""

    qtype: str
    data: torch.Tensor
    out_features: int
    in_features: int
    # What ``dequantize`` returns by default (the stage's dtype)
    dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def rows(self, start: int, stop: int) -> QuantizedWeight:
        """Output rows ``start:stop`` (blocks never cross rows, so this is a slice of
        the packed bytes)."""
        return QuantizedWeight(
            self.qtype,
            self.data[start:stop].clone(),
            stop - start,
            self.in_features,
            self.dtype,
        )

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> QuantizedWeight:
        return QuantizedWeight(
            self.qtype,
            self.data.to(device) if device is not None else self.data,
            self.out_features,
            self.in_features,
            dtype or self.dtype,
        )

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        # K-quants and others: the gguf package's numpy, on the CPU.
        if self.qtype not in BLOCK_FORMATS:
            import gguf

            kind = gguf.GGMLQuantizationType[self.qtype.upper()]
            dense = torch.from_numpy(
                gguf.quants.dequantize(self.data.cpu().numpy(), kind).astype("float32")
            )
            return dense.reshape(self.out_features, self.in_features).to(
                self.device, dtype or self.dtype
            )
        block_bytes, decode = BLOCK_FORMATS[self.qtype]
        blocks = self.data.view(self.out_features, -1, block_bytes)
        return (
            decode(blocks)
            .reshape(self.out_features, self.in_features)
            .to(dtype or self.dtype)
        )


class GGUFLinearBackend(LinearBackend):
    """Dequantize the packed weight to the activation's dtype, then the wrapped
    backend's GEMM. One subclass per block format (``backend_for``), so the name each
    call is counted under says the format."""

    def __init__(self, inner: LinearBackend) -> None:
        super().__init__(inner.device, inner.dtype)
        self.inner = inner

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        activation_from: int = 0,
    ) -> torch.Tensor:
        dense = (
            weight.dequantize(x.dtype)
            if isinstance(weight, QuantizedWeight)
            else weight
        )
        if activation_from:
            return self.inner.linear(x, dense, bias, activation, activation_from)
        return self.inner.linear(x, dense, bias, activation)


_BACKENDS: dict[str, type[GGUFLinearBackend]] = {}


def backend_class(qtype: str) -> type[GGUFLinearBackend]:
    """The wrapper counted as ``gguf_<qtype>`` (one class per format: a backend's name
    is a class attribute)."""
    if qtype not in _BACKENDS:
        _BACKENDS[qtype] = type(
            f"GGUF{qtype.upper()}LinearBackend",
            (GGUFLinearBackend,),
            {"name": f"gguf_{qtype}"},
        )
    return _BACKENDS[qtype]


def install(linear: Linear, weight: QuantizedWeight) -> None:
    """Put ``weight`` in ``linear`` instead of its dense weight (the Parameter is
    deleted)."""
    if weight.shape != torch.Size((linear.out_features, linear.in_features)):
        raise ValueError(
            f"packed weight {tuple(weight.shape)} for a [{linear.out_features}, "
            f"{linear.in_features}] layer"
        )
    del linear.weight  # the Parameter: the state dict no longer expects it
    linear.weight = weight  # type: ignore[assignment]  # the backend below dequantizes it per call
    linear.backend = backend_class(weight.qtype)(linear.backend)
    linear.backend_name = linear.backend.name
