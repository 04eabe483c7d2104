"""Platform-aware defaults (issue 15 item 1): an unset dtype / enforce_eager takes the
platform's value with source ``platform-default`` and the reason, never above anything a
user set. Both CPU kinds are injected: through ``DIFFSERVE_CPU_BF16`` and through the
/proc/cpuinfo text the detection parses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from config_helpers import run, write

from diffserve.config.platform import cpu_kind, emulate, emulation_env, native_bfloat16
from diffserve.errors import ConfigError
from diffserve.models.dtype import resolve_dtype

# Make test-kinds runs it under every emulated CPU kind.
pytestmark = pytest.mark.numerics
AVX512_BF16 = "processor : 0\nflags : fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
AMX = "processor : 0\nflags : fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
AVX512 = "processor : 0\nflags : fpu sse2 avx2 avx512f avx512bw\n"
AVX2 = "processor : 0\nflags : fpu sse2 avx2 fma\n"


@pytest.fixture
def detect(monkeypatch):
    """Drop the suite-wide pin so /proc/cpuinfo text decides."""
    monkeypatch.delenv("DIFFSERVE_CPU_BF16", raising=False)


def test_cpuinfo_flags_decide(detect) -> None:
    assert native_bfloat16(AVX512_BF16) == (
        True,
        "the CPU is AVX512_BF16 (avx512_bf16)",
    )
    assert native_bfloat16(AMX) == (
        True,
        "the CPU is AMX (amx_bf16, amx_int8, amx_tile)",
    )
    assert native_bfloat16(AVX512) == (
        False,
        "the CPU is AVX512 (avx512f): neither avx512_bf16 nor amx_bf16",
    )
    assert native_bfloat16(AVX2)[0] is False
    assert native_bfloat16("")[0] is False


def test_every_cpu_kind_is_told_apart() -> None:
    # torch.backends.cpu.get_cpu_capability() says AVX512 for the first three: AMX is a
    # kind of its own.
    kinds = {
        text: cpu_kind(text).name
        for text in (AMX, AVX512_BF16, AVX512, AVX2, "", "Features : fp asimd\n")
    }
    assert list(kinds.values()) == [
        "AMX",
        "AVX512_BF16",
        "AVX512",
        "AVX2",
        "other",
        "other",
    ]
    assert cpu_kind(AMX).native_bfloat16 and cpu_kind(AVX512_BF16).native_bfloat16
    assert not cpu_kind(AVX512).native_bfloat16 and not cpu_kind(AVX2).native_bfloat16


def test_a_kind_is_emulated_only_on_a_machine_that_has_its_instructions() -> None:
    amx, avx2 = cpu_kind(AMX), cpu_kind(AVX2)
    emulated = emulate(amx, "avx2")
    assert (
        emulated.name,
        emulated.emulated_on,
        emulated.native_bfloat16,
        emulated.avx512,
    ) == ("AVX2", "AMX", False, False)
    assert emulated.describe() == "AVX2 (emulated on AMX: DIFFSERVE_CPU_KIND)"
    assert emulate(amx, "AVX512_BF16").native_bfloat16 and emulate(avx2, "AVX2") == avx2
    for machine, requested in ((avx2, "AMX"), (avx2, "AVX512_BF16"), (amx, "SSE2")):
        with pytest.raises(ConfigError, match="cannot be emulated") as info:
            emulate(machine, requested)
        assert info.value.path == "DIFFSERVE_CPU_KIND"


def test_the_emulation_caps_every_kernel_library_and_tells_the_detection() -> None:
    assert emulation_env("AVX2") == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "DIFFSERVE_CPU_KIND": "AVX2",
    }
    # No AMX tiles.
    assert emulation_env("AVX512_BF16")["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    # A process started with it computes as that kind: torch's kernels and the detection
    # agree.
    real = cpu_kind()
    env = {**emulation_env("AVX2"), "PATH": ""}
    if real.name not in ("AMX", "AVX512_BF16", "AVX512", "AVX2"):
        pytest.skip(f"an {real.name} CPU emulates no x86 kind")
    probe = (
        "import torch; from diffserve.config.platform import cpu_kind; "
        "print(torch.backends.cpu.get_cpu_capability(), cpu_kind().name, "
        "cpu_kind().describe())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    capability, name, *_ = out.stdout.split()
    assert (capability, name) == ("AVX2", "AVX2")
    # Make test-kinds runs this test under an emulated kind too.
    hardware = real.emulated_on or real.name
    assert ("emulated on" in out.stdout) == (hardware != "AVX2")


@pytest.mark.parametrize(
    ("pin", "dtype"), [("1", "bfloat16"), ("0", "float32")], ids=["avx512-bf16", "avx2"]
)
def test_cpu_defaults_per_kind(monkeypatch, pin: str, dtype: str) -> None:
    monkeypatch.setenv("DIFFSERVE_CPU_BF16", pin)
    resolved = run()
    stage = resolved.stages[0]
    assert (stage.dtype, stage.enforce_eager) == (dtype, True)
    for key in ("stages.0.dtype", "stages.0.enforce_eager"):
        source = resolved.source_of(key)
        assert source.layer == "platform-default" and source.detail.startswith("cpu: ")
        assert not resolved.is_explicit(key)
    assert ("native bfloat16" if pin == "1" else "conversions") in resolved.source_of(
        "stages.0.dtype"
    ).detail
    assert "torch.compile" in resolved.source_of("stages.0.enforce_eager").detail


def test_accelerators_keep_compiling_in_bfloat16(monkeypatch) -> None:
    monkeypatch.setenv("DIFFSERVE_CPU_BF16", "0")
    resolved = run(platform="cuda")
    assert (resolved.stages[0].dtype, resolved.stages[0].enforce_eager) == (
        "bfloat16",
        False,
    )
    assert resolved.source_of("stages.0.dtype").layer == "platform-default"
    assert resolved.source_of("stages.0.enforce_eager").layer == "default"


def test_anything_a_user_set_wins(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DIFFSERVE_CPU_BF16", "1")
    assert (
        run(overrides={"dtype": "float32", "enforce_eager": False}).stages[0].dtype
        == "float32"
    )
    assert run(overrides={"enforce_eager": False}).stages[0].enforce_eager is False
    # An explicit auto is a choice.
    assert run(overrides={"dtype": "auto"}).stages[0].dtype == "auto"
    deploy = write(
        tmp_path / "d.yaml",
        """
        platforms:
          cpu: {dtype: float32}
        """,
    )
    resolved = run(deploy_config=deploy)
    assert (
        resolved.stages[0].dtype == "float32"
        and resolved.source_of("stages.0.dtype").layer == "platform"
    )
    assert run(env={"DIFFSERVE_ENFORCE_EAGER": "0"}).stages[0].enforce_eager is False


def test_explicit_auto_follows_the_same_rule_in_the_worker(monkeypatch) -> None:
    monkeypatch.setenv("DIFFSERVE_CPU_BF16", "1")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv("DIFFSERVE_CPU_BF16", "0")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


def test_config_explain_names_this_cpu_kind(tiny_flux_dir) -> None:
    # Detected, not pinned: the reason names the kind and its deciding flags (amx_bf16
    # on an AMX machine). Under make test-kinds the command computes as the emulated
    # kind, as this process does.
    emulating = {
        key: os.environ[key] for key in emulation_env("AVX2") if key in os.environ
    }
    env = {"HF_HUB_OFFLINE": "1", "PATH": "", **emulating}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffserve.entrypoints.cli",
            "config",
            "explain",
            str(tiny_flux_dir),
            "--platform",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    row = next(
        line
        for line in proc.stdout.splitlines()
        if line.startswith("0 ") and line.split()[1] == "dtype"
    )
    kind = cpu_kind()
    assert f"the CPU is {kind.describe()}" in row, row
    # The value column, not the reason (an AVX2 reason says why bfloat16 is not the
    # default).
    assert row.split()[2] == ("bfloat16" if kind.native_bfloat16 else "float32"), row
    if kind.name == "AMX":
        assert "amx_bf16" in row


def test_config_explain_shows_the_reason(tiny_flux_dir) -> None:
    env = {"DIFFSERVE_CPU_BF16": "1", "HF_HUB_OFFLINE": "1", "PATH": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffserve.entrypoints.cli",
            "config",
            "explain",
            str(tiny_flux_dir),
            "--platform",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {
        line.split()[1]: line
        for line in proc.stdout.splitlines()
        if line.startswith("0 ")
    }
    assert (
        "bfloat16" in rows["dtype"]
        and "platform-default" in rows["dtype"]
        and "native bfloat16" in rows["dtype"]
    )
    assert (
        "platform-default" in rows["enforce_eager"]
        and "torch.compile" in rows["enforce_eager"]
    )


@pytest.mark.parametrize(
    ("pin", "dtype"), [("1", "bfloat16"), ("0", "float32")], ids=["avx512-bf16", "avx2"]
)
def test_an_engine_with_no_dtype_runs_the_platform_default(
    monkeypatch, tiny_flux_dir, pin: str, dtype: str
) -> None:
    from diffserve import Engine, GenerationRequest

    monkeypatch.setenv("DIFFSERVE_CPU_BF16", pin)
    with Engine(str(tiny_flux_dir), env={}) as engine:
        out = engine.generate(
            GenerationRequest(
                prompt="a fox",
                height=64,
                width=64,
                num_inference_steps=2,
                seed=1,
                max_sequence_length=16,
            )
        )
        stage = engine.config.stages[0]
    assert out.attestation["dtype"] == dtype  # what the worker actually built
    assert stage.enforce_eager is True and out.attestation["transformer_forwards"] == 2
