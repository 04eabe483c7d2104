"""AR stages on vLLM, end to end through the public ``Engine``: an LLM stage (``kind:
ar``) in front of tiny FLUX.

What the deploy YAML alone asks of the AR stage (dtype, eager, max_num_seqs,
max_model_len, the executor) is read back inside the vLLM worker that ran each request
(``ar/probe.py``): on ``uni`` that worker is this process, on ``mp`` a process of its
own per rank (tensor parallel over two). Two sequential requests each, the worker's
forward counters reset between them; a dense and a MoE model (its experts class
attested); a negative control whose worker was forced to other settings fails the same
check. Then the prefill/decode split (the prompt's KV really loaded: corrupted, it
changes the text) and the faults (a prompt over max_model_len, a model that does not
load, a killed vLLM worker: the stage fails with 503 while requests that opt out are
still served).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import yaml

from diffserve import Engine, GenerationRequest
from diffserve.config import resolve
from diffserve.errors import ModelLoadError, RequestError, StageUnavailableError
from diffserve.zoo.llm.build import build_tiny_llm

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Random weights: draw only these, so every rewrite is words.
WORDS = ("Ġred", "Ġcircle", "Ġsquare", "Ġblue")
MAX_TOKENS = 5
# vLLM's CPU experts classes for float32 activations on x86 (its AMX grouped-GEMM class
# needs bfloat16 ones).
CPU_MOE_EXPERTS = ("CPUUnquantizedExperts", "X86CPUUnquantizedExperts")


@pytest.fixture(scope="module")
def llms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llms")
    return {
        kind: build_tiny_llm(f"tiny-{kind}", root / kind)
        for kind in ("qwen3", "qwen3-moe")
    }


def allowed_ids(llm: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llm).convert_tokens_to_ids(list(WORDS))


def ar_entry(llm: Path, executor: str, **extra: Any) -> dict[str, Any]:
    return {
        "stage_id": 0,
        "kind": "ar",
        "role": "prompt_rewrite",
        "model": str(llm),
        "dtype": "float32",
        "enforce_eager": True,
        "max_num_seqs": 3,
        "max_model_len": 192,
        "kv_cache_memory_bytes": 32 << 20,
        "distributed_executor_backend": executor,
        "system_prompt": "Describe the scene.",
        "default_sampling_params": {
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
            "allowed_token_ids": allowed_ids(llm),
        },
        **extra,
    }


def write_deploy(
    folder: Path, flux: Path, *ar: dict[str, Any], **diffusion: Any
) -> Path:
    """A deploy YAML file: the AR stage(s), then tiny FLUX as the diffusion stage (with
    ``diffusion``'s keys)."""
    path = folder / "deploy.yaml"
    doc = {
        "model": str(flux),
        "enforce_eager": True,
        "linear_backend": "torch",
        "stages": [
            *ar,
            {
                "stage_id": len(ar),
                "request_defaults": {
                    "num_inference_steps": 2,
                    "height": 64,
                    "width": 64,
                },
                **diffusion,
            },
        ],
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def engine_for(
    folder: Path,
    flux: Path,
    *ar: dict[str, Any],
    diffusion: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Engine:
    folder.mkdir(parents=True, exist_ok=True)
    return Engine(
        deploy_config=write_deploy(folder, flux, *ar, **(diffusion or {})), **kwargs
    )


def check_reached(
    entry: dict[str, Any], *, executor: str, moe: bool, tp: int = 1
) -> None:
    """The deploy YAML's AR settings, as every vLLM worker of the request read them from
    its own config."""
    assert entry["engine"] == "vllm" and entry["vllm_version"] == "0.32.0"
    assert sorted(worker["rank"] for worker in entry["workers"]) == list(range(tp))
    for worker in entry["workers"]:
        assert worker["dtype"] == "float32"
        assert worker["enforce_eager"] is True
        assert worker["max_num_seqs"] == 3
        assert worker["max_model_len"] == 192
        assert (
            worker["tensor_parallel_size"] == tp
            and worker["enable_expert_parallel"] is False
        )
        assert worker["distributed_executor_backend"] == executor
        assert worker["attention_backend"] == "CPU_ATTN"
        assert worker["kv_cache_blocks"] > 0
        assert (
            (worker["moe_experts"] in CPU_MOE_EXPERTS)
            if moe
            else worker["moe_experts"] is None
        )
    pids = entry["worker_pids"]
    assert (
        pids == [os.getpid()]
        if executor == "uni"
        else (os.getpid() not in pids and len(set(pids)) == tp)
    )


def two_requests(engine: Engine) -> list[Any]:
    return [
        engine.generate(GenerationRequest(prompt="a red circle", seed=7))
        for _ in range(2)
    ]


@pytest.fixture(scope="module")
def dense_uni(
    llms: dict[str, Path], tiny_flux_dir: Path, tmp_path_factory: pytest.TempPathFactory
):
    # Behind the AR stage: two replicas of the diffusion stage with a step cache (the
    # combination users meet).
    engine = engine_for(
        tmp_path_factory.mktemp("uni"),
        tiny_flux_dir,
        ar_entry(llms["qwen3"], "uni"),
        diffusion={
            "num_replicas": 2,
            "cache": {"backend": "fbcache", "threshold": 0.05},
        },
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def moe_mp(
    llms: dict[str, Path], tiny_flux_dir: Path, tmp_path_factory: pytest.TempPathFactory
):
    # Tensor parallel over two vLLM worker processes (each expert split over both
    # ranks), each on its own cores.
    engine = engine_for(
        tmp_path_factory.mktemp("mp"),
        tiny_flux_dir,
        ar_entry(llms["qwen3-moe"], "mp", tensor_parallel_size=2, timeout_s=15),
    )
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("which", ["dense_uni", "moe_mp"])
def test_deploy_yaml_settings_reach_the_vllm_worker(
    which: str, request: pytest.FixtureRequest
) -> None:
    engine = request.getfixturevalue(which)
    executor, moe, tp = ("uni", False, 1) if which == "dense_uni" else ("mp", True, 2)
    first, second = two_requests(engine)
    for output in (first, second):
        [entry] = output.attestation["ar"]
        check_reached(entry, executor=executor, moe=moe, tp=tp)
        assert entry["role"] == "prompt_rewrite" and entry["stage_id"] == 0
        # Warmed up at start (warmup's default), and the warm-up is in no count below.
        assert entry["warmup_ms"] > 0
        assert entry["output_tokens"] == MAX_TOKENS and entry["prompt_tokens"] > 3
        assert (
            entry["config_fingerprint"]
            == output.config_fingerprint
            == engine.config.fingerprint
        )
        # The worker's own counters, reset between the two requests: one forward per
        # token drawn, and the prompt's tokens plus each drawn token but the last.
        assert entry["worker_counts"]["requests"] == 1
        assert entry["worker_counts"]["ranks"] == tp * [
            {
                "forward_calls": MAX_TOKENS,
                "tokens": entry["prompt_tokens"] + MAX_TOKENS - 1,
            }
        ]
        assert output.prompt == "a red circle"
        assert output.revised_prompt and set(output.revised_prompt.split()) <= {
            w[1:] for w in WORDS
        }
        assert (
            output.timings["ar_stage_0"]
            >= entry["total_ms"]
            >= entry["first_token_ms"]
            > 0.1
        )
        # The diffusion stage ran on the rewritten prompt.
        assert output.attestation["linear"]
        if which == "dense_uni":  # behind it: replicas and a step cache
            assert (
                output.attestation["replica"] in (0, 1)
                and output.attestation["cache"][0]["backend"] == "fbcache"
            )
    assert first.revised_prompt == second.revised_prompt  # greedy, same engine path
    assert (
        first.attestation["ar"][0]["worker_pids"]
        == second.attestation["ar"][0]["worker_pids"]
    )


def test_a_request_that_opts_out_skips_the_ar_stage(dense_uni: Engine) -> None:
    output = dense_uni.generate(
        GenerationRequest(prompt="a red circle", seed=7, rewrite_prompt=False)
    )
    assert (
        "ar" not in output.attestation
        and output.revised_prompt is None
        and output.prompt == "a red circle"
    )


def test_a_prompt_over_max_model_len_is_a_400_naming_the_stage(
    dense_uni: Engine,
) -> None:
    with pytest.raises(
        RequestError, match=r"AR stage 0 \(prompt_rewrite\).*max_model_len of 192"
    ) as caught:
        dense_uni.generate(GenerationRequest(prompt="red circle " * 120, seed=1))
    assert caught.value.param == "prompt"
    # Still serving.
    assert dense_uni.generate(
        GenerationRequest(prompt="a red circle", seed=7)
    ).revised_prompt


def test_negative_control_a_worker_forced_to_other_settings_fails_the_check(
    llms: dict[str, Path], tiny_flux_dir: Path, tmp_path: Path
) -> None:
    """The YAML says max_num_seqs 3 and max_model_len 192; the caller forces this worker
    to 2 and 160. Its YAML also turns the warm-up off: the first request is then the
    engine's first step, and the only one counted either way."""
    engine = engine_for(
        tmp_path,
        tiny_flux_dir,
        ar_entry(llms["qwen3"], "uni", warmup=False),
        stage_overrides={0: {"max_num_seqs": 2, "max_model_len": 160}},
    )
    try:
        [entry] = engine.generate(
            GenerationRequest(prompt="a red circle", seed=7)
        ).attestation["ar"]
    finally:
        engine.shutdown()
    assert (
        entry["workers"][0]["max_num_seqs"] == 2
        and entry["workers"][0]["max_model_len"] == 160
    )
    assert entry["warmup_ms"] is None
    assert entry["worker_counts"]["ranks"] == [
        {"forward_calls": MAX_TOKENS, "tokens": entry["prompt_tokens"] + MAX_TOKENS - 1}
    ]
    with pytest.raises(AssertionError):
        check_reached(entry, executor="uni", moe=False)


def test_prefill_and_decode_hand_the_prompts_kv_over(
    llms: dict[str, Path], tiny_flux_dir: Path, tmp_path: Path
) -> None:
    """Two vLLM engines of one LLM: the prefill one stores the prompt's KV
    (ExampleConnector's files), the decode one loads it and draws the rewrite; corrupted
    files change what it draws."""
    storage = tmp_path / "kv"
    # A system prompt long enough for two full KV blocks of 32 tokens (the CPU
    # attention's multiple).
    pair = {
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
        "block_size": 32,
        "system_prompt": "Describe the scene: " + "a red circle on a blue square, " * 8,
    }
    prefill = ar_entry(llms["qwen3"], "uni", role="prefill", **pair)
    decode = {**ar_entry(llms["qwen3"], "uni", role="decode", **pair), "stage_id": 1}
    engine = engine_for(tmp_path / "pd", tiny_flux_dir, prefill, decode)
    try:
        # Both halves warmed up at start: the prefill engine stored the warm-up
        # prompt's KV for the decode engine to load (a named folder keeps it).
        assert len(list(storage.iterdir())) == 1
        handed = engine.generate(GenerationRequest(prompt="a red circle", seed=7))
        first, second = handed.attestation["ar"]
        assert (first["role"], second["role"]) == ("prefill", "decode")
        assert first["kv_transfer"] == {
            "connector": "ExampleConnector",
            "role": "kv_producer",
            "tokens_loaded": 0,
            "tokens_saved": first["prompt_tokens"],
        }
        loaded = second["kv_transfer"]["tokens_loaded"]
        assert second["kv_transfer"]["role"] == "kv_consumer"
        # Every full block but the last token's.
        assert loaded == (second["prompt_tokens"] - 2) // 32 * 32 >= 64
        assert first["output_tokens"] == 1 and second["output_tokens"] == MAX_TOKENS
        assert handed.revised_prompt and handed.prompt == "a red circle"
        # A user-named folder keeps the files (shared with others): corrupt them, and
        # the decode engine, which loads them again for the same prompt (the prefill
        # engine finds them stored and stores nothing), draws from the corrupted KV.
        files = sorted(storage.glob("*/*.safetensors"))
        assert files, "the prefill engine stored no KV"
        generator = torch.Generator().manual_seed(0)
        for file in files:
            kv = safetensors.torch.load_file(file)["kv_cache"]
            safetensors.torch.save_file(
                {"kv_cache": torch.randn(kv.shape, generator=generator) * 50}, file
            )
        corrupted = engine.generate(GenerationRequest(prompt="a red circle", seed=7))
        assert corrupted.attestation["ar"][1]["kv_transfer"]["tokens_loaded"] == loaded
        assert corrupted.revised_prompt != handed.revised_prompt
    finally:
        engine.shutdown()


def test_diffserves_own_kv_folder_keeps_only_prompts_in_flight(
    llms: dict[str, Path], tmp_path: Path
) -> None:
    """A pair without shared_storage_path gets a private folder: a prompt's files go
    once its decode loaded them (the warm-up's included), the folder at close; a folder
    the deploy file names is left as vLLM leaves it. (``llms``: vLLM imported.)"""
    from diffserve.ar.kv_handover import KvHandover
    from diffserve.config.ar_schema import ArStageConfig

    def pair_of(**extra: Any) -> KvHandover:
        return KvHandover(
            ArStageConfig(
                stage_id=0, role="prefill", model="llm", kv_connector_extra_config=extra
            )
        )

    ids = list(range(70))
    owned, named = pair_of(), pair_of(shared_storage_path=str(tmp_path / "named"))
    own_folder = owned.folder
    assert own_folder is not None and own_folder.is_dir()
    kept = []
    for handover in (owned, named):
        files = handover.files_of(ids, 32)
        assert files is not None and files.parent == handover.folder
        files.mkdir(parents=True)
        (files / "model.layers.0.self_attn.attn.safetensors").write_bytes(b"kv")
        handover.release(ids, 32)
        kept.append(files.exists())
        # Named by the full blocks only (64 of 70 tokens, the last one never stored).
        assert handover.files_of([*ids[:64], 1, 2, 3, 4, 5, 6], 32) == files
    assert kept == [False, True]
    owned.close()
    named.close()
    assert not own_folder.exists() and (tmp_path / "named").is_dir()


def test_a_model_that_does_not_load_names_the_stage(
    llms: dict[str, Path], tiny_flux_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(
        '{"model_type": "qwen3", "architectures": ["NoSuchForCausalLM"]}'
    )
    with pytest.raises(ModelLoadError, match=r"AR stage 0 \(prompt_rewrite\)"):
        engine_for(
            tmp_path, tiny_flux_dir, ar_entry(llms["qwen3"], "uni", model=str(broken))
        )
    # Sampling defaults each in range but contradicting each other: vLLM's own check,
    # before its engine starts.
    contradicting = ar_entry(
        llms["qwen3"], "uni", default_sampling_params={"min_tokens": 9, "max_tokens": 4}
    )
    with pytest.raises(
        ModelLoadError, match=r"AR stage 0 \(prompt_rewrite\).*min_tokens"
    ):
        engine_for(tmp_path, tiny_flux_dir, contradicting)


def test_a_hung_vllm_worker_is_a_503_at_the_stages_deadline(moe_mp: Engine) -> None:
    """Its workers stopped (SIGSTOP), the request fails at timeout_s (15 s: warmed up at
    start, a request takes ~40 ms on an idle 2-core machine; the first step, seconds,
    was the warm-up's) instead of hanging; resumed, the stage serves again (vLLM drops
    the late request)."""
    [entry] = moe_mp.generate(
        GenerationRequest(prompt="a red circle", seed=7)
    ).attestation["ar"]
    for pid in entry["worker_pids"]:
        os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(
            StageUnavailableError,
            match=r"AR stage 0 \(prompt_rewrite\) did not answer within its "
            r"timeout_s of 15s",
        ):
            moe_mp.generate(GenerationRequest(prompt="a red circle", seed=7))
    finally:
        for pid in entry["worker_pids"]:
            os.kill(pid, signal.SIGCONT)
    assert 15 <= time.monotonic() - started < 45
    assert moe_mp.generate(
        GenerationRequest(prompt="a red circle", seed=7)
    ).revised_prompt


def test_a_killed_vllm_worker_fails_the_stage_not_the_engine(moe_mp: Engine) -> None:
    """Last in this module: it takes the mp engine's AR stage down."""
    [entry] = moe_mp.generate(
        GenerationRequest(prompt="a red circle", seed=7)
    ).attestation["ar"]
    for pid in entry["worker_pids"]:
        os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(StageUnavailableError, match=r"AR stage 0 \(prompt_rewrite\)"):
        moe_mp.generate(GenerationRequest(prompt="a red circle", seed=7))
    assert time.monotonic() - started < 60
    # At once, never queued.
    with pytest.raises(StageUnavailableError, match="rewrite_prompt: false"):
        moe_mp.generate(GenerationRequest(prompt="a red circle", seed=7))
    served = moe_mp.generate(
        GenerationRequest(prompt="a red circle", seed=7, rewrite_prompt=False)
    )
    assert served.images and "ar" not in served.attestation
    health = {s["stage_id"]: s for s in moe_mp.stage_health}
    assert health[0]["replicas_live"] == 0 and health[1]["replicas_live"] == 1


def test_the_deploy_files_settings_are_explained_with_their_sources(
    llms: dict[str, Path], tiny_flux_dir: Path, tmp_path: Path
) -> None:
    config = resolve(
        deploy_config=write_deploy(
            tmp_path, tiny_flux_dir, ar_entry(llms["qwen3"], "uni")
        )
    )
    assert config.source_of("stages.0.max_num_seqs").location.endswith(
        "deploy.yaml:" + str(config.source_of("stages.0.max_num_seqs").line)
    )
    assert config.source_of("stages.0.seed").layer == "default"
    assert [s.stage_id for s in config.stages] == [1]


def test_an_ar_stage_before_a_staged_topology_and_before_the_generic_path(
    llms: dict[str, Path], tiny_flux_dir: Path, tiny_sd3_dir: Path, tmp_path: Path
) -> None:
    """The AR stage in front of split_text_encoder (its stages numbered after it: 1 =
    text_encoder on its own worker, 2 = diffusion) and in front of a generic diffusers
    family (SD3), each drawing from the rewritten prompt."""
    staged = tmp_path / "staged.yaml"
    staged.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_flux_dir),
                "topology": "split_text_encoder",
                "enforce_eager": True,
                "stages": [
                    ar_entry(llms["qwen3"], "uni"),
                    {"stage_id": 1, "linear_backend": "torch"},
                    {
                        "stage_id": 2,
                        "request_defaults": {
                            "num_inference_steps": 2,
                            "height": 64,
                            "width": 64,
                        },
                    },
                ],
            }
        )
    )
    config = resolve(deploy_config=staged, env={})
    assert [(s.stage_id, s.role) for s in config.stages] == [
        (1, "text_encoder"),
        (2, "diffusion"),
    ]
    assert config.source_of("stages.1.linear_backend").layer == "yaml"
    with Engine(deploy_config=staged, env={}) as engine:
        output = engine.generate(GenerationRequest(prompt="a red circle", seed=7))
    [entry] = output.attestation["ar"]
    assert entry["stage_id"] == 0 and output.revised_prompt
    encode, denoise = output.attestation["stages"]
    assert (encode["stage_id"], encode["role"], set(encode["linear"])) == (
        1,
        "text_encoder",
        {"torch"},
    )
    assert (denoise["stage_id"], denoise["role"]) == (2, "diffusion")
    with engine_for(
        tmp_path / "sd3", tiny_sd3_dir, ar_entry(llms["qwen3"], "uni")
    ) as generic:
        sd3 = generic.generate(
            GenerationRequest(prompt="a red circle", seed=7, height=64, width=64)
        )
    assert (
        sd3.attestation["implementation"] == "generic"
        and sd3.attestation["ar"][0]["output_tokens"] == MAX_TOKENS
    )
    # One LLM, one chat, greedy: the same rewrite.
    assert sd3.revised_prompt == output.revised_prompt
