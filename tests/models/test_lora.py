"""Per-request LoRA on native FLUX: parity with diffusers' load_lora_weights +
set_adapters, composition, no leak into base requests, file checks, per-row attestation,
compile without recompiling per adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.errors import ConfigError, LoraError
from diffserve.models.flux.lora_file import native_linear_shapes, read_flux_lora
from diffserve.models.flux.params import FluxParams
from diffserve.models.loader import read_config
from diffserve.zoo.lora import build_flux_lora

REQUEST = dict(
    prompt="a red fox",
    height=64,
    width=64,
    num_inference_steps=3,
    seed=3,
    max_sequence_length=64,
    guidance_scale=3.5,
)


def psnr(a: Any, b: Any) -> float:
    mse = float(
        (
            (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2
        ).mean()
    )
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def adapters(tiny_flux_dir: Path, tmp_path_factory: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        "a": build_flux_lora(tiny_flux_dir, root / "a", seed=1),
        "b": build_flux_lora(tiny_flux_dir, root / "b", seed=2),
    }


@pytest.fixture(scope="module")
def engine(tiny_flux_dir: Path, adapters: dict[str, Path]) -> Any:
    modules = ",".join(f"{name}={path}" for name, path in adapters.items())
    with Engine(
        str(tiny_flux_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        lora_modules=modules,
        max_loras=2,
        env={},
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def diffusers_pipe(tiny_flux_dir: Path, adapters: dict[str, Path]) -> Any:
    pytest.importorskip(
        "peft", reason="diffusers' LoRA loading needs peft (the test extra installs it)"
    )
    import diffusers

    pipe = diffusers.FluxPipeline.from_pretrained(
        str(tiny_flux_dir), torch_dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    for name, path in adapters.items():
        pipe.load_lora_weights(str(path.parent), adapter_name=name)
    return pipe


def reference(pipe: Any, names: list[str], scales: list[float]) -> np.ndarray:
    pipe.set_adapters(names, scales)
    image = pipe(
        prompt=REQUEST["prompt"],
        height=64,
        width=64,
        num_inference_steps=3,
        guidance_scale=3.5,
        max_sequence_length=64,
        generator=torch.Generator().manual_seed(3),
    ).images[0]
    return np.asarray(image)


def generate(engine: Any, loras: Any = ()) -> Any:
    return engine.generate(GenerationRequest(**REQUEST, loras=loras))


def test_adapter_matches_diffusers_and_is_attested(
    engine: Any, diffusers_pipe: Any
) -> None:
    base = generate(engine)
    out = generate(engine, [("a", 0.8)])
    assert psnr(out.images[0], base.images[0]) < 40  # the adapter changes the picture
    assert psnr(out.images[0], reference(diffusers_pipe, ["a"], [0.8])) >= 40
    assert out.attestation["lora"] == {"adapters": [{"name": "a", "scale": 0.8}]}
    assert out.attestation["lora_linear_calls"] > 0
    assert (
        "lora" not in base.attestation and "lora_linear_calls" not in base.attestation
    )


def test_two_adapters_compose_as_diffusers_does(
    engine: Any, diffusers_pipe: Any
) -> None:
    out = generate(engine, [("b", 0.5), ("a", 0.8)])
    assert psnr(out.images[0], reference(diffusers_pipe, ["a", "b"], [0.8, 0.5])) >= 40
    # Canonical order.
    assert [a["name"] for a in out.attestation["lora"]["adapters"]] == ["a", "b"]


def test_base_requests_are_unchanged_after_lora_requests(
    engine: Any, tiny_flux_dir: Path
) -> None:
    generate(engine, [("a", 1.0)])
    after = generate(engine).images[0]
    with Engine(
        str(tiny_flux_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        env={},
    ) as plain:
        # A base request never takes the adapter branch (Linear._run): the plain
        # engine's kernels, bit for bit.
        assert (
            after.tobytes()
            == plain.generate(GenerationRequest(**REQUEST)).images[0].tobytes()
        )


def test_concurrent_requests_with_different_adapters_each_get_their_own(
    engine: Any,
) -> None:
    alone = {
        name: generate(engine, [(name, 1.0)]).images[0].tobytes() for name in ("a", "b")
    }
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        futures = [
            (name, pool.submit(generate, engine, [(name, 1.0)]))
            for name in ("a", "b", "a", "b")
        ]
        for name, future in futures:
            assert future.result().images[0].tobytes() == alone[name]


@pytest.mark.parametrize(
    ("loras", "needle"),
    [
        ([("nope", 1.0)], "unknown LoRA adapter"),
        ([("a", 9.0)], "max_lora_scale"),
        ([("a", 1.0), ("b", 1.0), ("c", 1.0)], "max_loras"),
        ([("../../etc/passwd", 1.0)], "unknown LoRA adapter"),
    ],
)
def test_bad_choices_are_request_errors_naming_loras(
    engine: Any, loras: Any, needle: str
) -> None:
    from diffserve.errors import RequestError

    with pytest.raises(RequestError, match=needle) as info:
        generate(engine, loras)
    assert info.value.param == "loras"
    assert generate(engine).images  # and the engine keeps serving


def test_paths_only_inside_lora_dir(
    tiny_flux_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    from diffserve.errors import RequestError

    outside = build_flux_lora(tiny_flux_dir, tmp_path / "outside", seed=5)
    root = adapters["a"].parent.parent
    with Engine(str(tiny_flux_dir), dtype="float32", lora_dir=str(root), env={}) as eng:
        out = eng.generate(
            GenerationRequest(
                **REQUEST, loras=[("a/pytorch_lora_weights.safetensors", 1.0)]
            )
        )
        assert (
            out.attestation["lora"]["adapters"][0]["name"]
            == "a/pytorch_lora_weights.safetensors"
        )
        for name in (
            str(outside),
            "../outside/pytorch_lora_weights.safetensors",
            "missing.safetensors",
        ):
            with pytest.raises(RequestError) as info:
                eng.generate(GenerationRequest(**REQUEST, loras=[(name, 1.0)]))
            assert info.value.param == "loras"


def test_bad_registered_files_fail_the_start(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    for modules, needle in (
        (f"x={junk}", "not a safetensors"),
        (f"x={tmp_path / 'gone.safetensors'}", "no such"),
    ):
        with pytest.raises(ConfigError, match=needle) as info:
            Engine(str(tiny_flux_dir), lora_modules=modules, env={})
        assert "lora_modules.x" in str(info.value)


def test_file_checks_keys_ranks_and_kohya_names(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    params = FluxParams.from_diffusers_config(
        read_config(tiny_flux_dir / "transformer")
    )
    shapes = native_linear_shapes(tiny_flux_dir / "transformer", params)
    hidden = shapes["img_in"][0]

    def write(tensors: dict[str, torch.Tensor]) -> Path:
        path = tmp_path / f"f{len(list(tmp_path.iterdir()))}.safetensors"
        save_file(tensors, str(path))
        return path

    def read(path: Path, max_rank: int = 64) -> Any:
        return read_flux_lora(path, params, shapes, name="x", max_rank=max_rank)

    stray = write({"transformer.nowhere.lora_A.weight": torch.zeros(2, hidden)})
    with pytest.raises(LoraError, match="match no layer"):
        read(stray)
    mismatch = write(
        {
            "transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(
                2, hidden
            ),
            "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(
                hidden, 3
            ),
        }
    )
    with pytest.raises(LoraError, match="rank mismatch"):
        read(mismatch)
    fused = write(
        {
            f"transformer.transformer_blocks.0.attn.to_{p}.lora_{ab}.weight": (
                torch.ones(2, hidden)
            )
            if ab == "A"
            else torch.ones(hidden, 2)
            for p in "qkv"
            for ab in "AB"
        }
    )
    a, b = read(fused).layers["double_blocks.0.img_attn.qkv"]
    assert a.shape == (6, hidden) and b.shape == (3 * hidden, 6)
    # Block-placed parts.
    assert (
        b[:hidden, 2:].abs().sum() == 0 and b[hidden : 2 * hidden, 2:4].abs().sum() > 0
    )
    with pytest.raises(LoraError, match="max_lora_rank"):
        read(fused, max_rank=4)
    kohya = write(
        {
            "lora_unet_double_blocks_0_img_attn_proj.lora_down.weight": torch.ones(
                4, hidden
            ),
            "lora_unet_double_blocks_0_img_attn_proj.lora_up.weight": torch.ones(
                hidden, 4
            ),
            "lora_unet_double_blocks_0_img_attn_proj.alpha": torch.tensor(2.0),
        }
    )
    _, b = read(kohya).layers["double_blocks.0.img_attn.proj"]
    assert torch.allclose(b, torch.full_like(b, 0.5))  # alpha / rank folded into B


def test_compiled_engine_does_not_recompile_per_adapter(
    tiny_flux_dir: Path, adapters: dict[str, Path]
) -> None:
    from torch._dynamo.utils import counters

    modules = ",".join(f"{name}={path}" for name, path in adapters.items())

    def one_step(loras: Any) -> Any:
        return eng.generate(
            GenerationRequest(**{**REQUEST, "num_inference_steps": 1}, loras=loras)
        )

    # The first request compiles inside its batch: on a loaded 2-core machine that can
    # outlast the default two-minute batch deadline floor, which is for hung workers,
    # not for this.
    with Engine(
        str(tiny_flux_dir),
        dtype="float32",
        enforce_eager=False,
        lora_modules=modules,
        env={},
        deploy_config={"server": {"batch_deadline_floor_s": 900}},
    ) as eng:
        # Graphs for one adapter (the combined rank is a shape: a two-adapter request
        # compiles once more).
        one_step([("a", 1.0)])
        before = counters["stats"]["unique_graphs"]
        out = one_step([("b", 0.5)])
        one_step([("a", -0.4)])
        # Other adapters and scales: the same graphs.
        assert counters["stats"]["unique_graphs"] == before
        assert out.attestation["lora_linear_calls"] > 0
        # What the compiled blocks traced, attested (CPU: unfused single blocks; the
        # LoRA deltas are linear ops of their Linears)
        ops = out.attestation["compiled_ops"]
        assert ops["linear"] > 0 and ops["scaled_dot_product_attention"] > 0
        assert "diffserve.gemm_gelu_tail" not in ops


def test_lru_slots_and_batching_keep_each_image_its_own(
    tiny_flux_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """One slot for two adapters (every switch evicts), onednn (the CPU default) and
    max_batch_size 4 with concurrent requests of both adapters and the base: each image
    equals the same request run alone before (when its adapter sat in the slot by
    itself); requests of different adapters share step-level batches, each row its
    own adapters."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from diffserve.errors import RequestError

    modules = ",".join(f"{name}={path}" for name, path in adapters.items())
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x00" * 64)
    common = dict(
        dtype="float32", linear_backend="onednn", lora_modules=modules, env={}
    )
    choices = [[("a", 1.0)], [("b", 0.7)], [], [("a", 1.0)], [("b", 0.7)], []]
    with Engine(
        str(tiny_flux_dir),
        max_loras=1,
        max_batch_size=4,
        lora_dir=str(tmp_path),
        deploy_config={"server": {"max_steps": 300}},
        **common,
    ) as tight:
        alone = [generate(tight, c).images[0].tobytes() for c in choices[:3]]
        joins = tight.load.schedule.joins
        running = threading.Event()
        with ThreadPoolExecutor(len(choices) + 1) as pool:
            # A long base request runs first (300 steps), so the others arrive while a
            # batch is running and join it at step boundaries, whatever the machine's
            # load does to the threads' timing.
            host = pool.submit(
                tight.generate,
                GenerationRequest(**{**REQUEST, "num_inference_steps": 300}),
                on_progress=lambda _: running.set(),
            )
            assert running.wait(120)
            outs = list(pool.map(lambda c: generate(tight, c), choices))
            host.result()
        for i, out in enumerate(outs):
            assert out.images[0].tobytes() == alone[i % 3], i
        with pytest.raises(RequestError, match="not a safetensors") as info:
            generate(tight, [("corrupt.safetensors", 1.0)])
        assert info.value.param == "loras"
        with pytest.raises(RequestError, match="max_loras"):
            generate(tight, [("a", 1.0), ("b", 1.0)])
        # Requests of every adapter set joined the running batch (at most four rows at
        # once: the rest joined as rows left).
        assert tight.load.schedule.joins - joins >= len(choices) - 1
