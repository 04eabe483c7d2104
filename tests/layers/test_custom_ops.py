"""diffserve's ``torch.library`` operators: registration checked by ``opcheck`` (schema,
fake implementation, autograd registration, AOT dispatch), the merged GEMM with a GELU
tail against its two-GEMM reference, FlashAttention-3's operator traced on CPU without
its kernels (one graph node, no break), and the CUDA-only attention backends saying why
they cannot run here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffserve.errors import BackendUnavailableError
from diffserve.layers import ops  # noqa: F401  (registers the operators)
from diffserve.layers.attention.registry import REGISTRY, select_attention_backend
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.registry import select_linear_backend


def reference_gelu_tail(x, weight, bias, start):
    """Two GEMMs: the plain head, then the tanh-GELU'd tail, concatenated."""
    head = F.linear(x, weight[:start], None if bias is None else bias[:start])
    tail = F.linear(x, weight[start:], None if bias is None else bias[start:])
    return torch.cat((head, F.gelu(tail, approximate="tanh")), dim=-1)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 32), (2, 5, 32)])
def test_gemm_gelu_tail_passes_opcheck(with_bias, shape) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    weight = torch.randn(48, 32, generator=g)
    bias = torch.randn(48, generator=g) if with_bias else None
    torch.library.opcheck(torch.ops.diffserve.gemm_gelu_tail, (x, weight, bias, 24))


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("dtype", "atol"), [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)]
)
def test_gemm_gelu_tail_is_the_two_gemm_math(dtype, atol) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, 64, generator=g).to(dtype)
    weight = (torch.randn(160, 64, generator=g) / 8).to(dtype)
    bias = torch.randn(160, generator=g).to(dtype)
    fused = torch.ops.diffserve.gemm_gelu_tail(x, weight, bias, 96)
    expected = reference_gelu_tail(x, weight, bias, 96)
    assert fused.shape == (3, 40, 160) and fused.dtype == dtype
    torch.testing.assert_close(fused, expected, atol=atol, rtol=atol)
    # The head really is linear and the tail really is GELU'd (not all or nothing)
    assert (fused[..., :96] < -0.5).any() and (fused[..., 96:] >= -0.2).all()


@pytest.mark.numerics
@pytest.mark.parametrize("linear", ["torch", "onednn"])
def test_linear_with_an_activation_tail_on_each_backend(linear) -> None:
    backend = select_linear_backend(linear, "cpu", torch.float32)
    counters = KernelCounters()
    layer = Linear(
        32,
        80,
        backend=backend,
        counters=counters,
        activation="gelu_tanh",
        activation_from=48,
    )
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        out = layer(x)
    torch.testing.assert_close(
        out, reference_gelu_tail(x, layer.weight, layer.bias, 48), atol=2e-5, rtol=1e-5
    )
    assert counters.snapshot()["linear"] == {linear: 1}
    with pytest.raises(ValueError, match="activation_from"):
        Linear(32, 80, backend=backend, counters=counters, activation_from=48)


def test_the_torch_backend_runs_a_gelu_tail_as_the_custom_op() -> None:
    """One graph node for GEMM + GELU tail (what the traced tally counts)."""
    backend = select_linear_backend("torch", "cpu", torch.float32)
    layer = Linear(
        16,
        40,
        backend=backend,
        counters=KernelCounters(),
        activation="gelu_tanh",
        activation_from=24,
    )
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(layer, backend=capture, fullgraph=True)
    with torch.inference_mode():
        compiled(torch.randn(4, 16))
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets == ["diffserve.gemm_gelu_tail"]


def test_fa3_operator_passes_opcheck_and_traces_without_its_kernels() -> None:
    """On the meta device the fake implementation runs, as it does while tracing."""
    q = torch.empty(2, 24, 4, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 30, 4, 64, device="meta", dtype=torch.bfloat16)
    out = torch.ops.diffserve.fa3_attention(q, k, k)
    assert out.shape == (2, 24, 4, 64) and out.dtype == torch.bfloat16
    torch.library.opcheck(torch.ops.diffserve.fa3_attention, (q, k, k))

    def attend(q, k, v):
        return torch.ops.diffserve.fa3_attention(q, k, v).flatten(2) * 2

    explained = torch._dynamo.explain(attend)(q, k, k)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


@pytest.mark.parametrize("name", ["fa3", "sdpa_cudnn"])
def test_cuda_only_attention_backends_say_why_not_here(name) -> None:
    reason = REGISTRY.get_class(name).unavailable_reason(
        torch.device("cpu"), torch.bfloat16
    )
    assert reason is not None and "CUDA device" in reason
    with pytest.raises(BackendUnavailableError, match=name):
        select_attention_backend(name, "cpu", torch.bfloat16)
    # auto passes over both on a CPU
    assert select_attention_backend("auto", "cpu", torch.bfloat16).name == "sdpa"


def test_attention_aliases_name_the_new_backends() -> None:
    from diffserve.registry.backends import ATTENTION_BACKENDS

    spellings = ATTENTION_BACKENDS.spellings()
    assert spellings["flash_attention_3"] == "fa3"
    assert spellings["cudnn"] == "sdpa_cudnn"
    assert ATTENTION_BACKENDS.auto_preference[:2] == ("fa3", "sdpa_cudnn")
