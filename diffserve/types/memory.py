"""What a loaded component's weights take on its device (``models/memory.py`` measures
it): sent with the worker's ready handshake, logged when the engine is ready and shown
by ``GET /v1/config``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from diffserve.types.attestation import QuantizationReport


@dataclass(frozen=True)
class ComponentWeights:
    name: str  # transformer, text_encoder, text_encoder_2, vae...
    device: str
    # of its floating parameters (a quantized layer reports the dtype it computes in)
    dtype: str
    # what its parameters and buffers hold (quantized data and scales as stored)
    bytes: int
    parameters: int
    # The attestation's entry when quantized.
    quantization: QuantizationReport | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_weights(weights: dict[str, ComponentWeights]) -> str:
    """One line for a log: ``transformer 12.3 MiB int8 on cpu, text_encoder 1.0 MiB on
    cpu, ...; 20.1 MiB``."""
    mib = 2**20
    parts = [
        f"{w.name} {w.bytes / mib:.1f} MiB"
        + (f" {w.quantization['method']}" if w.quantization else "")
        + f" on {w.device}"
        for w in weights.values()
    ]
    return (
        ", ".join(parts)
        + f"; {sum(w.bytes for w in weights.values()) / mib:.1f} MiB in all"
    )
