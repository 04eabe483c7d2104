"""The persistent compile cache (worker/compile_cache.py): one directory per deployment,
keyed by model, config fingerprint, torch version and CPU capability; a worker points
inductor at it before compiling, and a second process finds its graphs there (torch's
own cache counters, no timings)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import programs
import pytest
import torch

from diffserve.config.platform import cpu_kind
from diffserve.config.resolve import resolve
from diffserve.worker import compile_cache
from diffserve.worker.compile_cache import (
    CompileCacheKey,
    cache_root,
    compile_cache_dir,
    key_for,
)

TESTS = Path(__file__).resolve().parents[1]
NEEDS_CC = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="torch.compile (inductor) on CPU needs a C compiler",
)


def _model(tmp_path: Path, name: str = "flux") -> Path:
    model = tmp_path / name
    model.mkdir()
    (model / "model_index.json").write_text(
        json.dumps({"_class_name": "FluxPipeline"}), encoding="utf-8"
    )
    return model


def test_key_changes_with_every_part() -> None:
    base = CompileCacheKey(
        model="/m/flux",
        fingerprint="f1",
        torch_version="2.13.0",
        cpu_capability="AVX512",
        cpu_kind="AVX512_BF16",
        device="cpu",
    )
    changed = [
        CompileCacheKey(**{**base.__dict__, field: value})
        for field, value in (
            ("model", "/m/other"),
            ("fingerprint", "f2"),
            ("torch_version", "2.14.0"),
            ("cpu_capability", "AVX2"),
            ("cpu_kind", "AMX"),
            ("device", "cuda"),
        )
    ]
    names = {base.dirname(), *(key.dirname() for key in changed)}
    assert len(names) == 1 + len(changed)
    # Stable across processes.
    assert CompileCacheKey(**base.__dict__).dirname() == base.dirname()
    assert base.dirname().startswith("flux-")


def test_key_follows_config_fingerprint_torch_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tmp_path)
    compiled = resolve(
        model=str(model), overrides={"enforce_eager": False, "dtype": "float32"}, env={}
    )
    other = resolve(
        model=str(model),
        overrides={"enforce_eager": False, "dtype": "bfloat16"},
        env={},
    )
    key = key_for(compiled, "cpu")
    assert key.model == str(model.resolve()) and key.fingerprint == compiled.fingerprint
    assert key.torch_version == torch.__version__
    assert key.cpu_capability == torch.backends.cpu.get_cpu_capability()
    # AMX and AVX512-BF16 machines keep apart caches.
    assert key.cpu_kind == cpu_kind().name
    assert key_for(other, "cpu").dirname() != key.dirname()
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert key_for(compiled, "cpu").dirname() != key.dirname()
    monkeypatch.undo()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "OTHER_ISA")
    assert key_for(compiled, "cpu").dirname() != key.dirname()


def test_cache_root_is_diffserve_cache_dir_or_home(tmp_path: Path) -> None:
    assert cache_root({"DIFFSERVE_CACHE_DIR": str(tmp_path)}) == tmp_path / "compile"
    assert cache_root({}) == Path.home() / ".cache" / "diffserve" / "compile"
    key = CompileCacheKey("/m/flux", "f", "t", "c", "k", "cpu")
    assert (
        compile_cache_dir(key, {"DIFFSERVE_CACHE_DIR": str(tmp_path)})
        == tmp_path / "compile" / key.dirname()
    )


def test_unwritable_root_falls_back_to_torch_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DIFFSERVE_CACHE_DIR", str(blocker))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/unchanged")
    config = resolve(
        model=str(_model(tmp_path)), overrides={"enforce_eager": False}, env={}
    )
    assert compile_cache.use_compile_cache(config, "cpu") is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/unchanged"


@pytest.mark.slow
@NEEDS_CC
def test_second_process_reuses_the_compiled_graphs(tmp_path: Path) -> None:
    model = _model(tmp_path)
    # tests/compile_once.py in two fresh processes. The run's TORCHINDUCTOR_CACHE_DIR
    # stays in their environment: use_compile_cache points inductor at the deployment's
    # directory over it.
    env = {
        **os.environ,
        "DIFFSERVE_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": programs.python_path_with(TESTS),
    }

    def run() -> dict:
        proc = programs.run("compile_once", model, env=env, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    config = resolve(
        model=str(model), overrides={"enforce_eager": False, "dtype": "float32"}, env={}
    )
    expected = tmp_path / "cache" / "compile" / key_for(config, "cpu").dirname()
    assert first["dir"] == second["dir"] == str(expected)
    assert (
        json.loads((expected / "key.json").read_text())["fingerprint"]
        == config.fingerprint
    )
    assert (
        first["aot"].get("autograd_cache_miss", 0) >= 1
        and first["aot"].get("autograd_cache_saved", 0) >= 1
    )
    assert first["aot"].get("autograd_cache_hit", 0) == 0
    assert (
        second["aot"].get("autograd_cache_hit", 0) >= 1
        and second["aot"].get("autograd_cache_miss", 0) == 0
    )
    assert (
        second["fx"].get("fxgraph_cache_hit", 0) >= 1
        and second["fx"].get("fxgraph_cache_miss", 0) == 0
    )
    isa = expected / "vec_isa.json"
    # X86: the first process probed; the second reuses a probe that fully passed.
    if isa.exists():
        recorded = json.loads(isa.read_text())
        # the same value in both processes: inductor's cache keys include it
        assert (
            first["vec_isa_ok"]
            is second["vec_isa_ok"]
            is (True if recorded["passed"] == recorded["reported"] else None)
        )


class _StubPipeline:
    """Stands in for FluxPipeline: Worker.load's cache set-up happens before the build,
    whatever it builds."""

    capabilities = None
    weights: dict = {}

    @classmethod
    def from_stage(
        cls, model_dir: str, stage: object, context: object
    ) -> _StubPipeline:
        assert "TORCHINDUCTOR_CACHE_DIR" in os.environ or stage.enforce_eager
        return cls()


@pytest.mark.parametrize("eager", [True, False])
def test_worker_load_sets_the_cache_only_when_compiling(
    eager: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffserve.registry.models import ModelFamily
    from diffserve.worker.worker import Worker

    monkeypatch.setattr(
        ModelFamily,
        "load_pipeline_class",
        lambda self, implementation=None: _StubPipeline,
    )
    # the SIMD memo (covered above) would set an inductor switch in this test process
    monkeypatch.setattr(compile_cache, "_reuse_vec_isa_probe", lambda directory: None)
    monkeypatch.setenv("DIFFSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/before")  # restored after the test
    config = resolve(
        model=str(_model(tmp_path)),
        overrides={"enforce_eager": eager, "dtype": "float32"},
        env={},
    )
    Worker(config, 0).load()
    expected = compile_cache_dir(key_for(config, "cpu"))
    if eager:  # an eager worker leaves torch's cache alone
        assert (
            os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/before" and not expected.exists()
        )
    else:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(expected)
        assert expected.parent == tmp_path / "cache" / "compile"
        assert (
            json.loads((expected / "key.json").read_text())["fingerprint"]
            == config.fingerprint
        )
