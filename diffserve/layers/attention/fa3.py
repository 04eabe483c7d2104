"""FlashAttention-3 (Hopper) through ``diffserve::fa3_attention`` (``layers/ops.py``): a
``torch.library`` operator with a fake implementation, so a compiled block traces it as
one node and never breaks its graph. Its kernels come from the ``fa3-fwd`` wheel
(forward only, bfloat16) or FlashAttention's Hopper build."""

from __future__ import annotations

import importlib.util

import torch

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.attention.cuda_checks import cuda_shortfall


def _installed_module() -> str | None:
    from diffserve.layers.ops import FA3_MODULES

    return next(
        (name for name in FA3_MODULES if importlib.util.find_spec(name) is not None),
        None,
    )


class FA3AttentionBackend(AttentionBackend):
    name = "fa3"
    supports_mask = False

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        module = _installed_module()
        missing = []
        if module is None:
            missing.append(
                "no FlashAttention-3 build is installed (pip install fa3-fwd)"
            )
        # The fa3-fwd wheel ships its bfloat16 kernels only
        dtypes = (
            (torch.bfloat16,)
            if module == "fa3_fwd_interface"
            else (torch.float16, torch.bfloat16)
        )
        missing += cuda_shortfall(device, dtype, dtypes, min_capability=(9, 0))
        if not missing and torch.cuda.get_device_capability(device)[0] != 9:
            missing.append("FlashAttention-3's kernels are built for Hopper (sm90)")
        return "; ".join(missing) or None

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device, dtype)
        from diffserve.layers import ops  # noqa: F401  (registers the operator)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.refuse_mask(mask)
        # FA3 wants [B, L, H, D] with the last dim contiguous: transposed views are.
        out = torch.ops.diffserve.fa3_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return out.flatten(2)
