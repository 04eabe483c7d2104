"""Deploy settings proven at runtime: the YAML's backends reach a worker that really
serves requests.

For native FLUX on each executor (uni, mp, ray), for tiny SD3, Qwen-Image and
FLUX.2-klein on the generic path (diffusers' own pipeline classes with their denoiser on
our kernels) on uni and mp, and for native Wan (two experts, video) on uni and mp, the
deploy YAML is the only source of dtype, linear_backend, attention_backend,
enforce_eager, the executor and the worker extension. ``BackendProbe`` (below) runs
inside the worker: in ``before_load`` it installs itself as a kernel observer
(``worker.observe_kernels``), so every backend object the model is built with is
recorded and its kernel method counted at call time (delegating to the original); in
``after_load`` it checks every Linear/Attention of the transformer uses a wrapped
backend and hooks the transformer's forward to record each output.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch
from e2e_utils import pid_alive

from diffserve import Engine, GenerationRequest
from diffserve.worker.extension import WorkerExtension

pytestmark = pytest.mark.e2e


class BackendProbe(WorkerExtension):
    """Test-only worker extension: records what the transformer really ran."""

    def before_load(self, worker: Any) -> None:
        self.selections: list[tuple[str, str, str]] = []
        self.backends: dict[str, list[Any]] = {"linear": [], "attention": []}
        self.reset()
        # The documented hook (layers/observe.py): no patched globals.
        worker.observe_kernels(self)

    def on_select(self, kind: str, requested: str, backend: Any) -> Any:
        """Kernel observer: record the selection and count the kernel method at call
        time."""
        self.selections.append((kind, requested, backend.name))
        original = getattr(backend, kind)
        probe = self

        def counted(*args: Any) -> Any:
            # The backend's name at call time: what actually served this call.
            probe.calls[kind][backend.name] += 1
            return original(*args)

        setattr(backend, kind, counted)
        self.backends[kind].append(backend)
        return backend

    def after_load(self, worker: Any) -> None:
        from diffserve.layers.attention.module import Attention
        from diffserve.layers.linear.module import Linear

        # The native pipeline's transformer (Wan: each expert), or the diffusers
        # denoiser of the generic path.
        experts = getattr(worker.pipeline, "experts", None)
        transformers = (
            list(experts.transformers.values())
            if experts is not None
            else [
                getattr(worker.pipeline, "denoiser", None)
                or worker.pipeline.transformer
            ]
        )
        wrapped = {id(b) for kind in self.backends for b in self.backends[kind]}
        self.modules = Counter()
        for module in (
            m for transformer in transformers for m in transformer.modules()
        ):
            if isinstance(module, (Linear, Attention)):
                kind = "linear" if isinstance(module, Linear) else "attention"
                how = "wrapped" if id(module.backend) in wrapped else "unwrapped"
                self.modules[f"{kind}_{how}"] += 1
            elif isinstance(module, torch.nn.Linear):
                # A linear that bypasses the backend registry.
                self.modules["plain_nn_linear"] += 1
        self.dtype = str(next(transformers[0].parameters()).dtype)

        def record(_module: Any, _inputs: Any, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            self.forwards.append((list(out.shape), bool(torch.isfinite(out).all())))

        for transformer in transformers:
            transformer.register_forward_hook(record)

    # -- RPC verbs
    # ----------------------------------------------------------------------------------

    def reset(self) -> None:
        self.calls: dict[str, Counter] = {"linear": Counter(), "attention": Counter()}
        self.forwards: list[tuple[list[int], bool]] = []

    def report(self) -> dict[str, Any]:
        return {
            "linear": dict(self.calls["linear"]),
            "attention": dict(self.calls["attention"]),
            "forwards": list(self.forwards),
            "selections": list(self.selections),
            "modules": dict(self.modules),
            "dtype": self.dtype,
            "pid": os.getpid(),
        }

    def force_backend_name(self, kind: str, name: str | None) -> None:
        """Negative control: make the backends report another name (None restores the
        class's)."""
        for backend in self.backends[kind]:
            if name is None:
                backend.__dict__.pop("name", None)
            else:
                backend.name = name


def deploy_yaml(tmp_path: Any, executor: str, **extra: Any) -> str:
    lines = [
        "dtype: float32",
        "linear_backend: torch",
        "attention_backend: sdpa",
        "enforce_eager: true",
        f"distributed_executor_backend: {executor}",
        f"worker_extension_cls: {BackendProbe.__module__}.BackendProbe",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    path = tmp_path / f"deploy-{executor}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


REQUEST = dict(
    prompt="a fox",
    height=128,
    width=128,
    num_inference_steps=2,
    guidance_scale=0.0,
    seed=42,
    n=1,
    max_sequence_length=64,
)
# Wan (tiny-wan22, two experts): 9 frames; of the 2 steps, the first is the high-noise
# expert's, the second the low-noise one's (boundary 875; the schedule's timesteps 999
# and 750).
VIDEO = dict(num_frames=9)


# Per model: the fixture that builds it and the denoiser output of one step at 128x128
# (batch 1).
MODELS = {
    "flux": ("tiny_flux_dir", [1, 64, 64]),
    "sd3": ("tiny_sd3_dir", [1, 16, 16, 16]),
    "wan": ("tiny_wan22_dir", [1, 16, 3, 16, 16]),
    # 8x8 tokens of 2x2 packed latents: Qwen-Image's 16 channels, FLUX.2's 32.
    "qwen": ("tiny_qwen_image_dir", [1, 64, 64]),
    "klein": ("tiny_flux2_klein_dir", [1, 64, 128]),
}
FAMILIES = {
    "flux": "FluxPipeline",
    "sd3": "StableDiffusion3Pipeline",
    "wan": "WanPipeline",
    "qwen": "QwenImagePipeline",
    "klein": "Flux2KleinPipeline",
}
GENERIC = ("sd3", "qwen", "klein")


def request_for(model: str) -> GenerationRequest:
    return GenerationRequest(**REQUEST, **(VIDEO if model == "wan" else {}))


@pytest.fixture(
    scope="module",
    params=[
        ("flux", "uni"),
        ("flux", "mp"),
        ("flux", "ray"),
        ("sd3", "uni"),
        ("sd3", "mp"),
        ("wan", "uni"),
        ("wan", "mp"),
        ("qwen", "uni"),
        ("qwen", "mp"),
        ("klein", "uni"),
        ("klein", "mp"),
    ],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def engine(request: Any, tmp_path_factory: Any) -> Any:
    model, executor = request.param
    # The session's local Ray, started only when a ray test is selected.
    if executor == "ray":
        request.getfixturevalue("ray_session")
    model_dir = request.getfixturevalue(MODELS[model][0])
    # env={}: no DIFFSERVE_* variable of the machine running the tests can change what
    # is proven.
    eng = Engine(
        str(model_dir),
        deploy_config=deploy_yaml(tmp_path_factory.mktemp("deploy"), executor),
        env={},
    )
    eng.test_model = model  # type: ignore[attr-defined]
    eng.test_model_dir = model_dir  # type: ignore[attr-defined]
    yield eng
    eng.shutdown()


def run_and_check(engine: Engine) -> tuple[Any, dict[str, Any]]:
    """One request with counters reset through RPC first; asserts everything the issue
    demands."""
    model = engine.test_model  # type: ignore[attr-defined]
    assert engine.collective_rpc("reset") == [None]
    out = engine.generate(request_for(model))
    report = engine.collective_rpc("report")[0]
    assert set(report["linear"]) == {"torch"} and report["linear"]["torch"] > 0, report[
        "linear"
    ]
    assert set(report["attention"]) == {"sdpa"} and report["attention"]["sdpa"] > 0, (
        report["attention"]
    )
    # The engine's own attestation agrees call for call with what the probe saw.
    assert out.attestation["linear"] == report["linear"]
    assert out.attestation["attention"] == report["attention"]
    assert out.attestation["transformer_forwards"] == 2
    assert len(report["forwards"]) == 2
    for shape, finite in report["forwards"]:
        assert shape == MODELS[model][1] and finite
    assert out.attestation["model_family"] == FAMILIES[model]
    assert out.attestation["implementation"] == (
        "generic" if model in GENERIC else "native"
    )
    if model == "wan":
        assert [v.shape for v in out.videos] == [(9, 128, 128, 3)] and not out.images
        assert out.attestation["experts"]["steps"] == ["transformer", "transformer_2"]
    else:
        assert len(out.images) == 1 and out.images[0].size == (128, 128)
    assert out.seeds == [42]
    assert set(out.timings) >= {"queue", "encode", "denoise", "decode"}
    return out, report


def test_yaml_backends_reach_the_worker_that_serves(engine: Engine) -> None:
    stage = engine.config.stage_for_role("diffusion")
    for key in (
        "dtype",
        "linear_backend",
        "attention_backend.default",
        "enforce_eager",
        "distributed_executor_backend",
        "worker_extension_cls",
    ):
        source = engine.config.provenance[f"stages.0.{key}"]
        assert source.layer == "yaml" and str(source.file).endswith(".yaml"), (
            key,
            source,
        )
    assert (stage.linear_backend, stage.attention_backend.default, stage.dtype) == (
        "torch",
        "sdpa",
        "float32",
    )

    for _ in range(2):
        out, report = run_and_check(engine)
        pid = out.attestation["worker_pid"]
        assert (
            report["pid"] == pid and out.attestation["executor"] == engine.executor_name
        )
        if engine.executor_name == "uni":
            assert pid == os.getpid()
        else:
            assert pid != os.getpid() and pid_alive(pid)
        # ray stamps the Ray node each result ran on; the others run on this machine and
        # say nothing.
        assert (out.attestation.get("node") is not None) == (
            engine.executor_name == "ray"
        )
        assert out.attestation["config_fingerprint"] == engine.config.fingerprint

    # What was built: every selection asked for the YAML's names and got them; no linear
    # or attention of the transformer escaped the wrapped backends; weights in the
    # YAML's dtype.
    assert {(k, asked, got) for k, asked, got in report["selections"]} == {
        ("linear", "torch", "torch"),
        ("attention", "sdpa", "sdpa"),
    }
    modules = report["modules"]
    assert (
        modules.get("linear_wrapped", 0) > 0 and modules.get("attention_wrapped", 0) > 0
    )
    assert not {k for k in modules if "unwrapped" in k or k == "plain_nn_linear"}, (
        modules
    )
    assert report["dtype"] == "torch.float32"


def test_negative_control_forced_backend_name_fails_the_check(engine: Engine) -> None:
    engine.collective_rpc("force_backend_name", args=("linear", "not-torch"))
    try:
        with pytest.raises(AssertionError):
            run_and_check(engine)
    finally:
        engine.collective_rpc("force_backend_name", args=("linear", None))
    run_and_check(engine)  # restored: the same check passes again


_IMAGES: dict[tuple[str, str], bytes] = {}


def test_same_seed_same_bytes_on_every_executor(engine: Engine, tmp_path: Any) -> None:
    model = engine.test_model  # type: ignore[attr-defined]

    def pixels(out: Any) -> bytes:
        return out.videos[0].tobytes() if model == "wan" else out.images[0].tobytes()

    _IMAGES[model, engine.executor_name] = pixels(engine.generate(request_for(model)))
    if (model, "uni") not in _IMAGES:
        # Only this parameter was selected (-k): make the uni image here so the
        # comparison still runs.
        with Engine(
            str(engine.test_model_dir),
            deploy_config=deploy_yaml(tmp_path, "uni"),  # type: ignore[attr-defined]
            env={},
        ) as uni:
            _IMAGES[model, "uni"] = pixels(uni.generate(request_for(model)))
    assert _IMAGES[model, engine.executor_name] == _IMAGES[model, "uni"]
    assert len(_IMAGES[model, "uni"]) == 128 * 128 * 3 * (9 if model == "wan" else 1)
