"""Heterogeneous LoRA in one batch (``LoraAdapters.activate_rows``): each row of a
batch runs its own adapters, bit for bit as its request alone with ``per_sample``
(batch_invariant), within float32 rounding without; equal row sets install nothing
again; one set for every row is exactly ``activate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from diffserve.config.schema import StageConfig
from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.layers.kernels import build_kernel_set
from diffserve.layers.linear.module import Linear
from diffserve.models.flux.lora import flux_lora_adapters
from diffserve.models.flux.sampling import image_ids, text_ids
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer
from diffserve.models.lora_adapters import LoraAdapters
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.zoo.lora import build_flux_lora

ROLES = MODEL_FAMILIES["FluxPipeline"].attention_roles
A = (("a", 1.0),)
AB = (("a", 1.0), ("b", 0.5))
C = (("c", 0.8),)  # single blocks only: elsewhere a zero pair beside A's layers
BASE: tuple[tuple[str, float], ...] = ()


@pytest.fixture(scope="module")
def adapters(tiny_flux_dir: Path, tmp_path_factory: Any) -> dict[str, Path]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("row_loras")
    paths = {
        "a": build_flux_lora(tiny_flux_dir, root / "a", seed=1),
        "b": build_flux_lora(tiny_flux_dir, root / "b", seed=2, rank=2),
    }
    full = build_flux_lora(tiny_flux_dir, root / "full_c", seed=3)
    with safe_open(str(full), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {
            k: handle.get_tensor(k)
            for k in handle.keys()  # noqa: SIM118
            if "single_transformer_blocks" in k
        }
    paths["c"] = root / "c.safetensors"
    save_file(tensors, str(paths["c"]), metadata=metadata)
    return paths


def _model(
    model_dir: Path,
    adapters: dict[str, Path],
    batch_invariant: bool,
    linear: str = "torch",
    max_loras: int = 3,
    compiled_stage: bool = False,
) -> tuple[FluxTransformer, LoraAdapters]:
    """``compiled_stage``: the stage compiles (``enforce_eager: false``), so per-row
    batches take the stacked form; the blocks are not compiled here."""
    kernels = build_kernel_set(
        linear,
        AttentionBackendConfig("sdpa"),
        roles=ROLES,
        device="cpu",
        dtype=torch.float32,
        batch_invariant=batch_invariant,
    )
    transformer = load_flux_transformer(model_dir / "transformer", kernels)
    stage = StageConfig(
        lora_modules={name: str(path) for name, path in adapters.items()},
        max_loras=max_loras,
        enforce_eager=not compiled_stage,
    )
    loras = flux_lora_adapters(transformer, transformer.params, stage)
    return transformer, loras


def _inputs(batch: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return dict(
        img=torch.randn(batch, 16, 64, generator=g),
        img_ids=image_ids(64, 64, device="cpu", dtype=torch.float32),
        txt=torch.randn(batch, 8, 64, generator=g),
        txt_ids=text_ids(8, device="cpu", dtype=torch.float32),
        timesteps=torch.rand(batch, generator=g),
        y=torch.randn(batch, 32, generator=g),
    )


def _row(inputs: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    return {k: v if k.endswith("_ids") else v[i : i + 1] for k, v in inputs.items()}


def _batch_and_alone(
    model: FluxTransformer, loras: LoraAdapters, sets: list[Any]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The batch's output rows, then the same batch in reverse order (only the row
    layout changes, nothing is installed again) put back in order, and each row alone
    (``activate``)."""
    inputs = _inputs(len(sets))
    back = list(reversed(range(len(sets))))
    with torch.inference_mode():
        loras.activate_rows(sets)
        batch = model(**inputs)
        loras.activate_rows(sets[::-1])
        reverse = model(
            **{k: v if k.endswith("_ids") else v[back] for k, v in inputs.items()}
        )[back]
        alone = []
        for i, loras_i in enumerate(sets):
            loras.activate(loras_i)
            alone.append(model(**_row(inputs, i)))
        loras.deactivate()
    return torch.stack([batch, reverse]), alone


@pytest.mark.parametrize("linear", ["torch", "onednn"])
@pytest.mark.parametrize("sets", [[A, BASE, AB], [C, A, BASE, C], [BASE, C, C]])
def test_per_sample_rows_equal_their_requests_alone_bit_for_bit(
    tiny_flux_dir: Path, adapters: dict[str, Path], linear: str, sets: list[Any]
) -> None:
    model, loras = _model(tiny_flux_dir, adapters, True, linear)
    # A layer patched by an earlier batch but targeted by none of these sets.
    loras.activate(AB)
    loras.deactivate()
    batch, alone = _batch_and_alone(model, loras, sets)
    for i, row in enumerate(alone):
        assert torch.equal(batch[:, i : i + 1], torch.stack([row, row])), (i, sets[i])
    # The adapters do change the rows (and a base row stays the base model).
    assert not torch.equal(alone[0], alone[1])


def test_grouped_rows_match_alone_within_rounding(
    tiny_flux_dir: Path, adapters: dict[str, Path]
) -> None:
    model, loras = _model(tiny_flux_dir, adapters, False)
    batch, alone = _batch_and_alone(model, loras, [A, BASE, AB, C])
    for i, row in enumerate(alone):
        assert (batch[:, i : i + 1] - row).abs().max().item() < 1e-5, i
    # Counted as a batch of one set: once per patched layer's call.
    calls = []
    for sets in ([A, BASE, AB, C], [AB] * 4):
        model.counters.reset()
        loras.activate_rows(sets)
        with torch.inference_mode():
            model(**_inputs(4))
        calls.append(model.counters.lora_linear_calls)
    assert calls[0] == calls[1] > 0


@pytest.mark.parametrize("per_sample", [True, False])
def test_compiled_stages_stacked_rows_match_alone_within_rounding(
    tiny_flux_dir: Path, adapters: dict[str, Path], per_sample: bool
) -> None:
    """A compiling stage's form (zero-padded slots gathered per row), run eagerly."""
    model, loras = _model(tiny_flux_dir, adapters, per_sample, compiled_stage=True)
    loras.activate(AB)
    loras.deactivate()
    batch, alone = _batch_and_alone(model, loras, [A, BASE, AB, C])
    for i, row in enumerate(alone):
        assert (batch[:, i : i + 1] - row).abs().max().item() < 1e-5, i


def test_equal_row_sets_install_nothing_again(
    tiny_flux_dir: Path, adapters: dict[str, Path], monkeypatch: Any
) -> None:
    _, loras = _model(tiny_flux_dir, adapters, True)
    installs: list[str] = []
    factors: list[str] = []
    for method, log in (
        ("set_lora_rows", installs),
        ("set_lora_stacked", installs),
        ("set_lora", installs),
        ("lora_factors", factors),
    ):
        original = getattr(Linear, method)

        def counted(
            self: Linear,
            *args: Any,
            _o: Any = original,
            _l: Any = log,
            _m: str = method,
        ) -> Any:
            _l.append(_m)
            return _o(self, *args)

        monkeypatch.setattr(Linear, method, counted)

    def fresh() -> tuple[bool, bool]:
        done = bool(installs), bool(factors)
        installs.clear()
        factors.clear()
        return done

    sets = [A, BASE, AB]
    loras.activate_rows(sets)
    assert fresh() == (True, True)
    layer = next(m for m in loras.linears.values() if m.lora_slots)
    slots = layer.lora_slots
    loras.activate_rows(list(sets))  # an equal list: nothing rebuilt or installed
    assert fresh() == (False, False) and layer.lora_slots is slots
    # A row joins with a set already there, rows move: only the layout changes.
    loras.activate_rows([AB, A, BASE, A])
    assert fresh() == (False, False) and layer.lora_slots is slots
    assert loras.state.rows == (1, 0, -1, 0)
    # Between batches the layers keep their pairs.
    loras.deactivate()
    loras.activate_rows(sets)
    assert fresh() == (False, False) and loras.state.active
    # A homogeneous batch in between replaces them (``activate``: built as ever); they
    # come back from the cache.
    loras.activate_rows([A, A])
    assert fresh() == (True, True) and not layer.lora_slots
    loras.activate_rows([A, A, A])  # the same set for one more row: nothing
    assert fresh() == (False, False)
    loras.activate_rows(sets)
    assert fresh() == (True, False)
    assert all(x is y for x, y in zip(layer.lora_slots, slots, strict=True))


def test_an_evicted_adapter_drops_its_cached_combinations(
    tiny_flux_dir: Path, adapters: dict[str, Path]
) -> None:
    _, loras = _model(tiny_flux_dir, adapters, True, max_loras=2)
    loras.activate_rows([A, (("b", 1.0),)])
    assert set(loras.combined) == {A, (("b", 1.0),)}
    loras.activate_rows([C, BASE])  # loading c evicts a (least recently used)
    assert "a" not in loras.resident
    assert set(loras.combined) == {(("b", 1.0),), C}


def test_one_set_for_every_row_is_activate(
    tiny_flux_dir: Path, adapters: dict[str, Path]
) -> None:
    model, loras = _model(tiny_flux_dir, adapters, True)
    inputs = _inputs(2)
    with torch.inference_mode():
        loras.activate(AB)
        expected = model(**inputs)
        pairs = {n: (m.lora_a, m.lora_b) for n, m in loras.linears.items()}
        loras.deactivate()
        loras.activate_rows([AB, AB])
        assert loras.state.rows is None and loras.state.adapters == AB
        assert torch.equal(model(**inputs), expected)
        for name, (a, b) in pairs.items():
            now = loras.linears[name].lora_a, loras.linears[name].lora_b
            if a is not None and b is not None:
                assert now[0] is not None and now[1] is not None
                assert torch.equal(now[0], a) and torch.equal(now[1], b)
        loras.activate_rows([BASE, BASE])
        assert not loras.state.active
        base = model(**inputs)
    plain, _ = _model(tiny_flux_dir, adapters, True)
    with torch.inference_mode():
        assert torch.equal(base, plain(**inputs))


def test_rows_must_match_the_batch(
    tiny_flux_dir: Path, adapters: dict[str, Path]
) -> None:
    model, loras = _model(tiny_flux_dir, adapters, False)
    loras.activate_rows([A, BASE])
    with pytest.raises(ValueError, match="2 rows"), torch.inference_mode():
        model(**_inputs(3))
    with pytest.raises(ValueError, match="no rows"):
        loras.activate_rows([])


class _Block(torch.nn.Module):
    def __init__(self, kernels: Any) -> None:
        super().__init__()
        self.up = kernels.make_linear(16, 32, activation="gelu_tanh")
        self.down = kernels.make_linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.up(x))


def _fake_reader(path: str, shapes: Any, name: str, rank: int, dtype: Any) -> Any:
    from diffserve.models.lora_adapters import LoraAdapter

    g = torch.Generator().manual_seed(ord(name))
    width = {"a": 4, "b": 2, "c": 3}[name]
    # c targets the first block only: elsewhere its rows get the zero pair.
    targets = [n for n in shapes if name != "c" or n.startswith("0.")]
    return LoraAdapter(
        name,
        path,
        {
            n: (
                torch.randn(width, shapes[n][1], generator=g) * 0.1,
                torch.randn(shapes[n][0], width, generator=g) * 0.1,
            )
            for n in targets
        },
    )


def test_compiled_blocks_take_every_row_layout_in_one_graph() -> None:
    """Once per-row mode has compiled, other layouts (slot counts, ranks, base rows)
    reuse the graphs: nothing in them depends on the layout."""
    import copy

    from torch._dynamo.utils import counters

    kernels = build_kernel_set(
        "torch",
        AttentionBackendConfig("sdpa"),
        roles=ROLES,
        device="cpu",
        dtype=torch.float32,
        batch_invariant=False,
    )
    torch.manual_seed(0)
    eager = torch.nn.Sequential(_Block(kernels), _Block(kernels)).requires_grad_(False)
    compiled = copy.deepcopy(eager)
    for block in compiled:
        block.compile(fullgraph=True, dynamic=True)
    stage = StageConfig(
        lora_modules={n: n for n in "abc"}, max_loras=3, enforce_eager=False
    )
    runs = [
        (model, LoraAdapters(model, stage, _fake_reader)) for model in (eager, compiled)
    ]
    a, b, c = ((("a", 1.0),), (("b", 1.0),), (("c", 1.0),))
    layouts: list[list[tuple[tuple[str, float], ...]]] = [
        [a, a, a],
        [a, BASE, b],
        [(("a", 0.5), ("b", 2.0)), c, BASE, a],
        [c, c, BASE],
        [b, a, c, BASE, a],
    ]
    graphs = []
    with torch.inference_mode():
        x = torch.randn(5, 7, 16, generator=torch.Generator().manual_seed(3))
        for layout in layouts:
            outs = []
            for model, loras in runs:
                loras.activate_rows(layout)
                outs.append(model(x[: len(layout)]))
            torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
            assert not torch.equal(outs[0][0], outs[0][1])  # rows differ
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[2:] == [graphs[1]] * 3, graphs


def test_cache_skips_follow_each_rows_adapters(
    tiny_flux_dir: Path, adapters: dict[str, Path]
) -> None:
    """A step-level batch of two adapter sets with the step cache on: the rows that
    compute run the remaining blocks on a subset of the batch, and each keeps its own
    adapters there (``LoraState.narrow``); every image equals its request alone."""
    from diffserve.models.base import library_admit
    from diffserve.models.flux.pipeline import FluxPipeline
    from diffserve.types.request import GenerationRequest
    from diffserve.types.results import BatchResult

    pipe = FluxPipeline.from_pretrained(
        tiny_flux_dir,
        linear_backend="torch",
        attention_backend="sdpa",
        cache={"backend": "fbcache", "threshold": 0.5},
        lora_modules={name: str(path) for name, path in adapters.items()},
    )

    def req(seed: int, loras: Any, threshold: float) -> GenerationRequest:
        return library_admit(
            pipe,
            GenerationRequest(
                prompt="a fox",
                height=64,
                width=64,
                num_inference_steps=6,
                seed=seed,
                max_sequence_length=32,
                loras=loras,
                cache_threshold=threshold,
            ),
        )

    # Different thresholds: at some steps one row computes and the other reuses.
    batch = [req(1, A, 0.9), req(2, AB, 0.05), req(3, BASE, 0.9)]
    outputs = [
        o for e in pipe.run(batch) if isinstance(e, BatchResult) for o in e.outputs
    ]
    decisions = set()
    for request, output in zip(batch, outputs, strict=True):
        alone = pipe(request)
        assert torch.equal(output.images, alone.images), request.loras
        assert output.attestation["cache"] == alone.attestation["cache"]
        decisions.add(output.attestation["cache"][0]["skipped_steps"])
    assert len(decisions) > 1  # the rows decided differently
