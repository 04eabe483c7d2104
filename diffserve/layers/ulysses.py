"""Ulysses sequence-parallel attention for the FLUX joint ``[text, image]`` sequence.

Layout across the ``U`` ranks of a Ulysses group (rank ``r``): every rank holds **all**
text tokens (the text stream is replicated) and image shard ``r`` (tokens ``[r *
L_img/U, (r + 1) * L_img/U)``), with all ``H`` heads, so local q/k/v are ``[B, H, L_txt
+ L_img/U, D]``.

1. One fused all-to-all of stacked Q/K/V image shards: afterwards rank ``r`` holds heads
   ``[r * H/U, (r + 1) * H/U)`` for the *full* image sequence (shards concatenated in
   rank order, which is the original token order). Text needs no exchange: it is
   replicated, so each rank slices its heads.
2. The ordinary attention backend runs on ``[B, H/U, L_txt + L_img, D]``: exact per-head
   attention over
   the whole joint sequence, so the result matches single-process attention up to kernel
   round-off.
3. One all-to-all back. Each chunk sent to rank ``j`` is ``[text rows, image shard j
   rows]`` of this
   rank's heads: the image part is the inverse of step 1 and the text part is what an
   all_gather of the text rows would move (each rank must receive the other ``U - 1``
   head groups of the text rows; no exchange moves fewer bytes). Riding in the same
   all-to-all saves a second collective launch per attention call. Every text head group
   is computed by exactly one rank and shipped bit for bit, so the replicated text
   stream stays identical on every rank.

Both exchanges go through ``layers/collectives.py:all_to_all_single``, which counts one
``all_to_all`` call and the bytes of the tensor handed to it (this rank's own chunk
included) into ``counters``: a ``CollectiveCounters``, a ``KernelCounters`` (its
``.collectives``; paused during warmup) or ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.collectives import all_to_all_single

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def allowed_ulysses_degrees(num_heads: int, image_tokens: int) -> list[int]:
    """Every degree ``U`` that divides both the head count and the image token count."""
    return [
        u
        for u in range(1, num_heads + 1)
        if num_heads % u == 0 and image_tokens % u == 0
    ]


def check_ulysses(num_heads: int, image_tokens: int, degree: int) -> str | None:
    """``None`` if ``degree`` can shard this attention, else a message naming the
    allowed degrees.

    Meant for config/admission checks too: ``image_tokens`` is ``(height / 16) * (width
    / 16)`` for FLUX.
    """
    if degree < 1:
        return f"ulysses degree must be >= 1, got {degree}"
    problems = []
    if num_heads % degree:
        problems.append(f"num_heads={num_heads} is not divisible by it")
    if image_tokens % degree:
        problems.append(f"image_tokens={image_tokens} is not divisible by it")
    if not problems:
        return None
    allowed = ", ".join(map(str, allowed_ulysses_degrees(num_heads, image_tokens)))
    return (
        f"ulysses degree {degree} cannot shard this attention: "
        f"{'; '.join(problems)} (allowed degrees: {allowed})"
    )


def image_shard(
    x: torch.Tensor, txt_len: int, rank: int, degree: int, dim: int = 1
) -> torch.Tensor:
    """The rank-local joint sequence ``[text, image shard rank]`` of a full ``[text,
    image]`` tensor along ``dim``.

    Used to build a rank's inputs from full tensors, e.g. the RoPE table (``dim=1`` of
    ``[2, L, D]``) or the image tokens fed to the transformer.
    """
    image_tokens = x.shape[dim] - txt_len
    if image_tokens % degree:
        raise ValueError(
            f"image_tokens={image_tokens} is not divisible by ulysses degree {degree}"
        )
    shard = image_tokens // degree
    start = txt_len + rank * shard
    return torch.cat((x.narrow(dim, 0, txt_len), x.narrow(dim, start, shard)), dim=dim)


def _all_to_all(x: torch.Tensor, group: Any, counters: Any) -> torch.Tensor:
    """Equal chunks of ``x`` along dim 0, one per rank of ``group``, exchanged and
    counted."""
    return all_to_all_single(torch.empty_like(x), x, group, counters)


def _ulysses(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attend: AttendFn,
    group: Any,
    txt_len: int,
    counters: Any,
) -> torch.Tensor:
    degree = dist.get_world_size(group)
    rank = dist.get_rank(group)
    batch, heads, local_len, head_dim = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"q, k, v must share one shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not 0 <= txt_len <= local_len:
        raise ValueError(
            f"txt_len={txt_len} is outside the local sequence of {local_len} tokens"
        )
    shard = local_len - txt_len
    problem = check_ulysses(heads, shard * degree, degree)
    if problem is not None:
        raise ValueError(problem)
    if degree == 1:
        return attend(q, k, v)
    hu = heads // degree
    mine = slice(rank * hu, (rank + 1) * hu)

    # Send buffer [U(dest head group), 3, B, H/U, L_img/U, D]: chunk j is what rank j
    # needs from us. Each of q/k/v is copied once, straight into place (they are usually
    # strided views of one projection).
    send = q.new_empty(degree, 3, batch, hu, shard, head_dim)
    for i, x in enumerate((q, k, v)):
        send[:, i].copy_(x[:, :, txt_len:].unflatten(1, (degree, hu)).transpose(0, 1))
    # [U(source shard), 3, B, H/U, L_img/U, D].
    recv = _all_to_all(send, group, counters)
    qkv = q.new_empty(3, batch, hu, txt_len + shard * degree, head_dim)
    for i, x in enumerate((q, k, v)):
        qkv[i, :, :, :txt_len].copy_(x[:, mine, :txt_len])
    # Shards in rank order are the original token order.
    qkv[:, :, :, txt_len:].unflatten(3, (degree, shard)).copy_(
        recv.permute(1, 2, 3, 0, 4, 5)
    )
    out = attend(qkv[0], qkv[1], qkv[2])  # [B, L_txt + L_img, (H/U) * D]

    # Back: chunk j = [text rows, image shard j rows] of our heads (text rides along;
    # see module doc).
    width = hu * head_dim
    # [U, B, L_img/U, width].
    img_out = out[:, txt_len:].unflatten(1, (degree, shard)).transpose(0, 1)
    txt_out = out[:, :txt_len].unsqueeze(0).expand(degree, batch, txt_len, width)
    back = _all_to_all(torch.cat((txt_out, img_out), dim=2), group, counters)
    # back: [U(source head group), B, L_local, (H/U) * D] -> [B, L_local, H * D], head
    # groups in order.
    return back.permute(1, 2, 0, 3).flatten(2)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    backend: AttentionBackend,
    group: Any,
    txt_len: int,
    counters: Any = None,
) -> torch.Tensor:
    """Ulysses attention over the joint sequence; see the module doc for the layout.

    ``q, k, v``: ``[B, H, txt_len + L_img/U, D]`` (all text tokens, this rank's image
    shard, all heads). Returns ``[B, txt_len + L_img/U, H * D]``: text rows and this
    rank's image rows, all heads, equal to the matching rows of ``backend.attention``
    over the full sequence. ``group``: a ``torch.distributed`` process group (``None``:
    the default group). Raises ``ValueError``, before any collective, when ``H`` is not
    divisible by the group size; image divisibility is enforced where the image is
    sharded (``image_shard``, or ``check_ulysses`` at admission), since each rank only
    sees its own equal shard. Two ``all_to_all`` calls per invocation (none when ``U ==
    1``). Inference only (no autograd).
    """
    return _ulysses(q, k, v, backend.attention, group, txt_len, counters)


class UlyssesAttention(nn.Module):
    """Wraps an attention module (``diffserve.layers.attention.module.Attention`` or any
    ``(q, k, v)`` callable module) so its backend runs on the Ulysses-exchanged heads;
    the wrapped module still counts its call.

    ``forward(q, k, v, txt_len)`` has the contract of ``ulysses_attention``.
    ``counters`` defaults to the wrapped module's ``counters`` (the transformer's
    ``KernelCounters``), so warmup pauses both tallies.
    """

    def __init__(self, attention: nn.Module, group: Any, counters: Any = None) -> None:
        super().__init__()
        self.inner = attention
        self.group = group
        self.counters = (
            counters if counters is not None else getattr(attention, "counters", None)
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, txt_len: int
    ) -> torch.Tensor:
        return _ulysses(q, k, v, self.inner, self.group, txt_len, self.counters)

    def extra_repr(self) -> str:
        degree = dist.get_world_size(self.group) if dist.is_initialized() else "?"
        return f"degree={degree}"
