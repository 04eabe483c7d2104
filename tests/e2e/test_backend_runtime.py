"""Deploy settings proven at runtime: the YAML's backends reach a worker that really
serves requests.

For native FLUX on each executor (uni, mp, ray), for tiny SD3, Qwen-Image, FLUX.2-klein,
Qwen-Image-2.1 (RGBA images), LTX-2 (a video and its audio) and HunyuanVideo-1.5 on the
generic path (diffusers' own pipeline classes with their denoiser on our kernels) on uni
and mp, and for native Wan (two experts, video) on uni and mp, the deploy YAML is the
only source of dtype, linear_backend, attention_backend, enforce_eager, the executor and
the worker extension. ``BackendProbe`` (below) runs inside the worker: in
``before_load`` it installs itself as a kernel observer (``worker.observe_kernels``), so
every backend object the model is built with is recorded and its kernel method counted
at call time (delegating to the original); in ``after_load`` it checks every
Linear/Attention of the transformer uses a wrapped backend and hooks the transformer's
forward to record each output. Per model, the request, the forwards it runs and what
comes back are in ``runtime_models.py``.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch
from e2e_utils import pid_alive
from runtime_models import MODELS, audio, output_bytes, pixels

from diffserve import Engine
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
        # denoiser of the generic path (LTX-2's returns (video, audio): the first is
        # recorded).
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
    # batch_invariant false: one backend call per Linear/Attention call, so the probe's
    # kernel calls and the attestation's module calls agree one for one (with it, a
    # module splits an input whose dim 0 is over 1 into one backend call per row yet
    # counts one call: layers/per_sample.py; LTX-2's CFG batch, Qwen-Image-2.1's
    # timestep pair).
    lines = [
        "dtype: float32",
        "linear_backend: torch",
        "attention_backend: sdpa",
        "enforce_eager: true",
        "batch_invariant: false",
        f"distributed_executor_backend: {executor}",
        f"worker_extension_cls: {BackendProbe.__module__}.BackendProbe",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    path = tmp_path / f"deploy-{executor}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


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
        ("qwen21", "uni"),
        ("qwen21", "mp"),
        ("ltx2", "uni"),
        ("ltx2", "mp"),
        ("hunyuan15", "uni"),
        ("hunyuan15", "mp"),
    ],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def engine(request: Any, tmp_path_factory: Any) -> Any:
    model, executor = request.param
    # The session's local Ray, started only when a ray test is selected.
    if executor == "ray":
        request.getfixturevalue("ray_session")
    model_dir = request.getfixturevalue(MODELS[model].fixture)
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
    model = MODELS[engine.test_model]  # type: ignore[attr-defined]
    assert engine.collective_rpc("reset") == [None]
    out = engine.generate(model.generation_request())
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
    assert out.attestation["transformer_forwards"] == model.forwards
    # Each forward's output in order: its shape, and all of it finite.
    assert [(list(shape), finite) for shape, finite in report["forwards"]] == [
        (shape, True) for shape in model.forward_shapes
    ]
    assert out.attestation["model_family"] == model.family
    assert out.attestation["implementation"] == (
        "generic" if model.generic else "native"
    )
    pixels(model, out)  # an image or a video's frames, of the request's size
    audio(model, out)  # LTX-2's waveform; none from the silent ones
    # The family's own entries, on the keys the table names.
    for key, expected in model.attested.items():
        got = out.attestation[key]
        assert {k: got.get(k) for k in expected} == expected, (key, got)
    # The YAML's batch_invariant: false reached the worker (a native family attests
    # its stage's; the generic path never claims it).
    assert out.attestation["batch_invariant"] is False
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
        "batch_invariant",
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


_OUTPUTS: dict[tuple[str, str], bytes] = {}


def test_same_seed_same_bytes_on_every_executor(engine: Engine, tmp_path: Any) -> None:
    name = engine.test_model  # type: ignore[attr-defined]
    model = MODELS[name]
    _OUTPUTS[name, engine.executor_name] = output_bytes(
        model, engine.generate(model.generation_request())
    )
    if (name, "uni") not in _OUTPUTS:
        # Only this parameter was selected (-k): make the uni output here so the
        # comparison still runs.
        with Engine(
            str(engine.test_model_dir),  # type: ignore[attr-defined]
            deploy_config=deploy_yaml(tmp_path, "uni"),
            env={},
        ) as uni:
            _OUTPUTS[name, "uni"] = output_bytes(
                model, uni.generate(model.generation_request())
            )
    assert _OUTPUTS[name, engine.executor_name] == _OUTPUTS[name, "uni"]
