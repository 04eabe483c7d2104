"""Kernel counts of a compiled module read from the graph torch.compile traced, at
compile time, and added each time that compiled graph runs.

Modules inside a compiled graph cannot count their own calls (``Linear.forward``'s
increment would be traced away), so ``compile_counted`` gives ``torch.compile`` a
backend of its own: it reads the traced FX graph once, finds every GEMM and attention
operator in it (``F.linear``, ``matmul``, ``scaled_dot_product_attention``, the cuDNN
attention op, diffserve's custom ops...), attributes each to the innermost ``Linear``
or ``Attention`` module it was traced in (the graph's ``nn_module_stack``), and tallies
one call per module under the backend that module was built with, plus the operators
actually captured. The tally must equal the module's eager inventory (every ``Linear``
and ``Attention`` it holds runs once per forward): a GEMM outside any counted module,
a missing module or a different count fails the compilation instead of attesting what
did not run. The graph then compiles with inductor, and the callable that runs it adds
the tally to the counters each time it runs (a dict update per block call, no device
work). A guard that falls back to eager leaves the modules counting themselves. LoRA
deltas are counted by the model (which layers an adapter patches differs per block,
while blocks of one class share their graphs).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from diffserve.layers.attention.module import Attention
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.module import Linear

# Traced operators that are GEMMs or attention kernels, by the name the tally reports.
KERNEL_OPS = frozenset(
    {
        "linear",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "einsum",
        "_addmm_activation",
        "_int_mm",
        "_scaled_mm",
        "aten.linear",
        "aten.mm",
        "aten.bmm",
        "aten.addmm",
        "aten._addmm_activation",
        "aten._int_mm",
        "aten._scaled_mm",
        "aten.scaled_dot_product_attention",
        "mkldnn._linear_pointwise",
        "diffserve.gemm_gelu_tail",
        "scaled_dot_product_attention",
        "aten._scaled_dot_product_cudnn_attention",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_efficient_attention",
        "diffserve.fa3_attention",
        "flash_attn._flash_attn_forward",
    }
)


class TracedTallyError(RuntimeError):
    """The traced graph does not run what the eager module would (compilation fails)."""


@dataclass
class TracedTally:
    """One compiled graph's calls: per backend (as ``KernelCounters`` counts them) and
    the operators captured for them."""

    linear: dict[str, int] = field(default_factory=dict)
    attention: dict[str, int] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)

    def as_counts(self) -> dict[str, Any]:
        return {"linear": self.linear, "attention": self.attention}


def op_name(target: Any) -> str:
    """``torch._C._nn.linear`` -> ``linear``; ``torch.ops.aten.mm.default`` ->
    ``aten.mm``; ``torch.ops.diffserve.gemm_gelu_tail`` -> ``diffserve.gemm_gelu_tail``;
    ``operator.matmul`` -> ``matmul``."""
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target._qualified_op_name).replace("::", ".")
    if target is operator.matmul:
        return "matmul"
    return str(getattr(target, "__name__", target))


_INDEX = re.compile(r"\[(\d+)\]|\._modules\['([^']+)'\]")


def module_path(stack_entry: str) -> str:
    """``"L['self'].img_mlp[0]"`` -> ``"img_mlp.0"`` (a path for ``get_submodule``)."""
    path = stack_entry.removeprefix("L['self']").removeprefix("L['mod']")
    path = _INDEX.sub(lambda m: f".{m.group(1) or m.group(2)}", path)
    return path.lstrip(".")


def _kernel_module(root: nn.Module, node: fx.Node) -> tuple[str, nn.Module] | None:
    """The innermost ``Linear`` / ``Attention`` the node was traced in."""
    stack = node.meta.get("nn_module_stack") or {}
    for path_text, cls in reversed(list(stack.values())):
        if isinstance(cls, type) and issubclass(cls, (Linear, Attention)):
            path = module_path(path_text)
            try:
                return path, root.get_submodule(path) if path else root
            except AttributeError:
                return None
    return None


def inventory(module: nn.Module) -> dict[str, dict[str, int]]:
    """Calls per backend of one eager forward of ``module``: every ``Linear`` and
    ``Attention`` in it runs exactly once (true of each transformer block)."""
    tally: dict[str, dict[str, int]] = {"linear": {}, "attention": {}}
    for layer in module.modules():
        if isinstance(layer, (Linear, Attention)):
            calls = tally["linear" if isinstance(layer, Linear) else "attention"]
            calls[layer.backend_name] = calls.get(layer.backend_name, 0) + 1
    return tally


def tally_graph(gm: fx.GraphModule, root: nn.Module) -> TracedTally:
    """The calls ``gm`` (traced from ``root``'s forward) makes: one per kernel
    module."""
    tally = TracedTally()
    seen: dict[str, nn.Module] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = op_name(node.target)
        if name not in KERNEL_OPS:
            continue
        found = _kernel_module(root, node)
        if found is None:
            raise TracedTallyError(
                f"{type(root).__name__}: the traced graph runs {name} outside any "
                "counted Linear or Attention module (a kernel the attestation would "
                "not see)"
            )
        path, module = found
        seen.setdefault(path, module)
        tally.ops[name] = tally.ops.get(name, 0) + 1
    for module in seen.values():
        if isinstance(module, Linear):
            tally.linear[module.backend_name] = (
                tally.linear.get(module.backend_name, 0) + 1
            )
        else:
            assert isinstance(module, Attention)
            tally.attention[module.backend_name] = (
                tally.attention.get(module.backend_name, 0) + 1
            )
    return tally


def check_inventory(tally: TracedTally, root: nn.Module) -> None:
    """Fail unless the traced calls are exactly the eager inventory of ``root``."""
    expected = inventory(root)
    traced = {"linear": tally.linear, "attention": tally.attention}
    if traced != expected:
        raise TracedTallyError(
            f"{type(root).__name__}: the traced graph calls {traced} but the module "
            f"runs {expected} eagerly (ops captured: {tally.ops})"
        )


@dataclass
class CountedCompiler:
    """A ``torch.compile`` backend for one module: tally the traced graph, check it
    against the module's inventory, compile it with inductor (``mode``'s options) and
    count the tally on every run. ``tallies`` keeps each traced graph's tally (the
    attestation's record of the operators captured)."""

    root: nn.Module
    counters: KernelCounters
    mode: str | None = None
    inner: str = "inductor"
    tallies: list[TracedTally] = field(default_factory=list)

    def __repr__(self) -> str:
        # torch names the backend in its errors: the module's class, not its tree
        return f"CountedCompiler({type(self.root).__name__}, mode={self.mode})"

    def __call__(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        tally = tally_graph(gm, self.root)
        check_inventory(tally, self.root)
        self.tallies.append(tally)
        compiled = self._compile(gm, example_inputs)
        counts, counters = tally.as_counts(), self.counters

        def run(*args: Any) -> Any:
            counters.add(counts)
            return compiled(*args)

        return run

    def _compile(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        if self.inner == "eager":  # tests: the tally without inductor's codegen
            return gm.forward
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx

        patches = list_mode_options(self.mode) if self.mode else None
        compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
            gm, list(example_inputs), config_patches=patches
        )
        return compiled


def kernel_signature(module: nn.Module) -> tuple[tuple[str, str], ...]:
    """``(path, backend)`` of every ``Linear`` / ``Attention`` in ``module``: modules
    with equal signatures trace to graphs with equal tallies."""
    return tuple(
        (name, layer.backend_name)
        for name, layer in module.named_modules()
        if isinstance(layer, (Linear, Attention))
    )


def compile_counted(
    modules: Sequence[nn.Module],
    counters: KernelCounters,
    *,
    mode: str | None = None,
    dynamic: bool = False,
    inner: str = "inductor",
) -> list[CountedCompiler]:
    """``torch.compile`` each of ``modules`` in place (lazily: the first call compiles)
    as one graph (``fullgraph``: a graph break fails instead of running half eager),
    counted from its trace. Modules of one class and kernel signature share one
    compiler, so they share their compiled graphs (one compile for FLUX's 38 single
    blocks, not 38). ``mode``: inductor's (``max-autotune-no-cudagraphs`` on GPUs);
    ``dynamic``: one graph for every sequence length (else one per shape)."""
    compilers: dict[tuple[type, tuple[tuple[str, str], ...]], CountedCompiler] = {}
    for module in modules:
        key = (type(module), kernel_signature(module))
        if key not in compilers:
            compilers[key] = CountedCompiler(module, counters, mode, inner)
        module.compile(backend=compilers[key], fullgraph=True, dynamic=dynamic)
    return list(compilers.values())
