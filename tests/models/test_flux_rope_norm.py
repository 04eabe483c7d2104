"""QK-norm + RoPE as the blocks run them: one float32 chain written straight into the
attention buffer, equal to the reference formulas."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffserve.models.flux.blocks import QKNorm, attention_inputs, norm_rope_into
from diffserve.models.flux.embeddings import apply_rope, rope, rope_rotation, rotate_


def _table(length: int = 24) -> torch.Tensor:
    ids = torch.zeros(length, 3)
    ids[:, 1] = torch.arange(length) // 6
    ids[:, 2] = torch.arange(length) % 6
    return rope(ids, (4, 6, 6), 10_000)


def _reference_rope(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """``x * cos + swap_pairs(x) * signed_sin`` in float64 (the reference's
    formulation)."""
    shape = (pe.shape[1],) + (1,) * (x.ndim - 3) + (pe.shape[2],)
    cos, sin = pe[0].double().view(shape), pe[1].double().view(shape)
    xd = x.double()
    return xd * cos + xd.unflatten(-1, (-1, 2)).flip(-1).flatten(-2) * sin


def _norm(dim: int = 16, seed: int = 0) -> QKNorm:
    norm = QKNorm(dim)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.query_norm.scale.copy_(torch.rand(dim, generator=g) + 0.5)
        norm.key_norm.scale.copy_(torch.rand(dim, generator=g) + 0.5)
    return norm


def test_apply_rope_is_the_reference_rotation() -> None:
    pe = _table()
    x = torch.randn(2, 24, 2, 3, 16)
    torch.testing.assert_close(
        apply_rope(x, pe).double(), _reference_rope(x, pe), rtol=0, atol=1e-6
    )
    xb = x.bfloat16()
    got = apply_rope(xb, pe)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(
        got.double(), _reference_rope(xb, pe), rtol=1e-2, atol=1e-2
    )


def test_norm_rope_into_a_strided_slice_matches_norm_then_rope() -> None:
    norm = _norm()
    qkv = torch.randn(2, 24, 3, 3, 16)
    before = qkv.clone()
    joint = torch.zeros(2, 30, 3, 3, 16)  # the rows 6..30 of a longer joint sequence
    norm_rope_into(joint[:, 6:, :2], qkv[:, :, :2], norm, _table(30), 6)
    expected = _reference_rope(norm(qkv[:, :, :2]), _table(30)[:, 6:])
    torch.testing.assert_close(
        joint[:, 6:, :2].double(), expected, rtol=1e-5, atol=1e-6
    )
    # Other rows and v untouched.
    assert torch.equal(joint[:, :6], torch.zeros_like(joint[:, :6]))
    assert torch.equal(joint[:, 6:, 2], torch.zeros(2, 24, 3, 16))
    # Float32 input is only read (the chain copies before scaling in place)
    assert torch.equal(qkv, before)


def test_bfloat16_rounds_once() -> None:
    pe, norm = _table(), _norm(seed=1).bfloat16()
    qk = torch.randn(1, 24, 2, 3, 16).bfloat16()
    truth = _reference_rope(
        F.rms_norm(qk.double(), (16,), eps=1e-6) * norm.scales(torch.float64), pe
    )
    out = torch.empty_like(qk)
    norm_rope_into(out, qk, norm, pe)
    unfused = apply_rope(norm(qk), pe)  # norm rounded to bfloat16, then rotated
    err = (out.double() - truth).norm() / truth.norm()
    assert err < 4e-3 and err <= (unfused.double() - truth).norm() / truth.norm() + 1e-4


def test_attention_inputs_join_parts_text_first() -> None:
    pe = _table(30)
    txt, img = torch.randn(2, 6, 3, 3, 16), torch.randn(2, 24, 3, 3, 16)
    nt, ni = _norm(seed=2), _norm(seed=3)
    q, k, v = attention_inputs([(txt, nt), (img, ni)], pe)
    assert q.shape == k.shape == v.shape == (2, 3, 30, 16)
    torch.testing.assert_close(
        v, torch.cat((txt, img), 1)[:, :, 2].transpose(1, 2), rtol=0, atol=0
    )
    qk = torch.cat((nt(txt[:, :, :2]), ni(img[:, :, :2])), dim=1)
    expected = _reference_rope(qk, pe)
    torch.testing.assert_close(
        q.double(), expected[:, :, 0].transpose(1, 2), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        k.double(), expected[:, :, 1].transpose(1, 2), rtol=1e-5, atol=1e-6
    )


def test_rotation_is_converted_once_per_table() -> None:
    pe = _table()
    first = rope_rotation(pe)
    assert rope_rotation(pe) is first
    torch.testing.assert_close(first.abs(), torch.ones(first.shape), rtol=0, atol=1e-6)
    pe.mul_(1.0)  # an in-place change (version bump) is seen
    assert rope_rotation(pe) is not first
    with torch.inference_mode():
        table = _table()
        # Inference tensors have no version counter.
        assert rope_rotation(table) is rope_rotation(table)


def test_the_compiled_form_is_the_same_rotation(monkeypatch) -> None:
    # Inductor has no complex codegen: under torch.compile, rotate_ takes the real form
    # instead.
    pe = _table(30)
    x = torch.randn(2, 24, 2, 3, 16)
    eager = rotate_(x.clone(), pe, 6)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    compiled_form = rotate_(x.clone(), pe, 6)
    torch.testing.assert_close(compiled_form, eager, rtol=1e-6, atol=1e-6)
