"""What the CUDA-only attention backends check before they can run."""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)


def cuda_shortfall(
    device: torch.device,
    dtype: torch.dtype,
    dtypes: tuple[torch.dtype, ...] = HALF_DTYPES,
    min_capability: tuple[int, int] | None = None,
) -> list[str]:
    """Why ``device``/``dtype`` is not a CUDA device of at least ``min_capability``
    running one of ``dtypes`` (empty: it is)."""
    missing = []
    if device.type != "cuda":
        missing.append(f"it needs a CUDA device, but the device is {device.type!r}")
    elif not torch.cuda.is_available():
        missing.append("it needs a CUDA device, but torch.cuda.is_available() is False")
    elif min_capability is not None:
        found = torch.cuda.get_device_capability(device)
        if found < min_capability:
            missing.append(
                "it needs compute capability >= "
                f"{'.'.join(map(str, min_capability))}, but the GPU has "
                f"{'.'.join(map(str, found))}"
            )
    if dtype not in dtypes:
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        missing.append(
            f"it supports {names} only, but the dtype is "
            f"{str(dtype).removeprefix('torch.')}"
        )
    return missing


def is_hopper(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.x (H100, H200, GH200)."""
    return (
        device.type == "cuda"
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability(device)[0] == 9
    )
