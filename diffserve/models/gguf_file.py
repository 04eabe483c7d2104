"""GGUF transformer files (city96's FLUX layout: BFL's tensor names,
``general.architecture`` = ``flux``), read with the ``gguf`` package (the ``gguf``
extra). 2-D weights stay packed as the file holds them and are dequantized per call
(layers/linear/gguf.py): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and F16/BF16 in torch, the
K-quants and other types ``gguf`` reads by its numpy code. 1-D tensors (biases, norm
scales) load dense.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from diffserve.errors import ModelLoadError
from diffserve.layers.linear.gguf import QuantizedWeight
from diffserve.logging import get_logger

logger = get_logger(__name__)

GGUF_ARCHITECTURE = "flux"


def read_gguf(path: str | Path) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Every tensor of a FLUX GGUF file, in torch's ``[out, in]`` order; block-quantized
    ones packed."""
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(
            f"{path}: reading GGUF files needs the gguf package: "
            "pip install 'diffserve[gguf]'"
        ) from None
    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"{file}: no such file")
    try:
        reader = gguf.GGUFReader(str(file))
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise ModelLoadError(
            f"{file}: not a readable GGUF file ({exc}); a truncated "
            "download? fetch it again"
        ) from None
    field = reader.fields.get("general.architecture")
    architecture = field.contents() if field is not None else None
    if architecture != GGUF_ARCHITECTURE:
        raise ModelLoadError(
            f"{file}: GGUF architecture {architecture!r}, expected "
            f"{GGUF_ARCHITECTURE!r} "
            "(a FLUX transformer, as city96's FLUX GGUF files are)"
        )
    tensors: dict[str, torch.Tensor | QuantizedWeight] = {}
    for entry in reader.tensors:
        qtype = entry.tensor_type.name.lower()
        # GGUF lists the innermost first.
        shape = tuple(int(d) for d in reversed(entry.shape.tolist()))
        raw = np.array(entry.data)  # out of the memory map: the file's bytes, once
        packable = (
            len(shape) == 2
            and qtype != "f32"
            and (qtype not in ("f16", "bf16") or shape[1] % 32 == 0)
        )
        if packable:  # kept as the file has it: [out, bytes per row]
            packed = np.ascontiguousarray(raw).view(np.uint8).reshape(shape[0], -1)
            tensors[entry.name] = QuantizedWeight(
                qtype, torch.from_numpy(packed), shape[0], shape[1]
            )
        elif qtype in ("f32", "f16"):
            tensors[entry.name] = torch.from_numpy(raw).reshape(shape)
        elif qtype == "bf16":
            tensors[entry.name] = (
                torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16).reshape(shape)
            )
        else:
            dense = gguf.quants.dequantize(entry.data, entry.tensor_type)
            tensors[entry.name] = torch.from_numpy(
                np.ascontiguousarray(dense, dtype=np.float32)
            ).reshape(shape)
    counts: dict[str, int] = {}
    for value in tensors.values():
        name = (
            value.qtype
            if isinstance(value, QuantizedWeight)
            else str(value.dtype).removeprefix("torch.")
        )
        counts[name] = counts.get(name, 0) + 1
    logger.info(
        "read %s: %d tensors (%s)",
        file,
        len(tensors),
        ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
    )
    return tensors
