"""AR stages in the deploy config (``kind: ar``): diffserve's keys and vLLM's flat
EngineArgs fields, resolved with the same precedence, overlays, provenance, explain and
fingerprint as every key, and the rules that refuse what vLLM cannot run. No engine
starts here: the names are checked against the installed vLLM's source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_helpers import line_of, run, write

from diffserve.config import vllm_args
from diffserve.config.explain import explain_dict, render_table
from diffserve.errors import ConfigError


@pytest.fixture
def llm(tmp_path: Path) -> Path:
    folder = tmp_path / "llm"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "qwen3"}), encoding="utf-8"
    )
    return folder


def deploy(tmp_path: Path, flux: Path, body: str) -> Path:
    return write(tmp_path / "deploy.yaml", f"model: {flux}\n" + body)


AR = """
stages:
  - stage_id: 0
    kind: ar
    role: prompt_rewrite
    model: llm
    dtype: bf16
    enforce_eager: true
    max_num_seqs: 4
    max_model_len: 512
    system_prompt: Expand the prompt.
    default_sampling_params: {temperature: 0, max_tokens: 48}
  - stage_id: 1
    linear_backend: torch
"""


def test_the_issues_deploy_file_resolves(
    tmp_path: Path, flux_model: Path, llm: Path
) -> None:
    path = deploy(tmp_path, flux_model, AR)
    config = run(deploy_config=path)
    [ar] = config.ar_stages
    # Relative to the file.
    assert (ar.stage_id, ar.role, ar.model) == (0, "prompt_rewrite", str(llm.resolve()))
    assert dict(ar.engine_args) == {
        "dtype": "bfloat16",
        "enforce_eager": True,
        "max_num_seqs": 4,
        "max_model_len": 512,
        "distributed_executor_backend": "uni",
        "seed": 0,
        "kv_cache_memory_bytes": 256 << 20,
    }
    assert dict(ar.default_sampling_params) == {"temperature": 0.0, "max_tokens": 48}
    assert ar.system_prompt == "Expand the prompt."
    # The diffusion stage follows the AR stage, as the file numbers it.
    assert [(s.stage_id, s.role) for s in config.stages] == [(1, "diffusion")]
    assert config.stage(1).linear_backend == "torch"
    assert (
        config.source_of("stages.0.max_num_seqs").location
        == f"{path}:{line_of(path, 'max_num_seqs')}"
    )
    assert config.source_of("stages.0.seed").layer == "default"
    assert (
        config.source_of("stages.0.kv_cache_memory_bytes").layer == "platform-default"
    )
    assert not config.is_explicit("stages.0.kv_cache_memory_bytes")
    # Warmed up unless the file says otherwise; the default never poses as explicit.
    assert ar.warmup is True and not config.is_explicit("stages.0.warmup")
    cold = run(deploy_config=path, stage_overrides={"0": {"warmup": "false"}})
    assert cold.ar_stages[0].warmup is False
    assert cold.source_of("stages.0.warmup").layer == "cli_stage"
    assert cold.fingerprint != config.fingerprint


def test_precedence_overlays_and_stage_overrides(
    tmp_path: Path, flux_model: Path, llm: Path
) -> None:
    write(
        tmp_path / "base.yaml",
        f"""
        model: {flux_model}
        stages:
          - stage_id: 0
            kind: ar
            model: {llm}
            max_num_seqs: 2
            max_model_len: 256
        """,
    )
    path = write(
        tmp_path / "child.yaml",
        """
        base_config: base.yaml
        stages:
          - stage_id: 0
            max_num_seqs: 3
        platforms:
          cpu:
            stages:
              - stage_id: 0
                max_model_len: 384
        """,
    )
    config = run(deploy_config=path, stage_overrides={"0": {"max_num_seqs": 8}})
    args = config.ar_stages[0].engine_args
    assert (args["max_num_seqs"], args["max_model_len"]) == (8, 384)
    assert config.source_of("stages.0.max_num_seqs").layer == "cli_stage"
    assert config.source_of("stages.0.max_model_len").layer == "platform"
    # A pipeline-wide value is the diffusion stages': the AR stage keeps vLLM's own
    # dtype.
    assert (
        "dtype"
        not in run(deploy_config=path, overrides={"dtype": "float32"})
        .ar_stages[0]
        .engine_args
    )


def test_explain_and_fingerprint(tmp_path: Path, flux_model: Path, llm: Path) -> None:
    config = run(deploy_config=deploy(tmp_path, flux_model, AR))
    doc = explain_dict(config)
    first = doc["stages"][0]
    assert (first["stage_id"], first["kind"]) == (0, "ar")
    assert first["fields"]["max_num_seqs"] == {
        "value": 4,
        "source": "yaml",
        "location": first["fields"]["max_num_seqs"]["location"],
    }
    assert first["fields"]["seed"]["source"] == "default"
    assert "max_num_seqs" in render_table(config)
    bigger = run(
        deploy_config=deploy(
            tmp_path, flux_model, AR.replace("max_num_seqs: 4", "max_num_seqs: 5")
        )
    )
    assert bigger.fingerprint != config.fingerprint
    without = run(
        deploy_config=write(tmp_path / "plain.yaml", f"model: {flux_model}\n")
    )
    # No AR stage: the fingerprint it had.
    assert without.fingerprint == run(model=flux_model).fingerprint


@pytest.mark.parametrize(
    ("entry", "path", "message", "hint"),
    [
        (
            "max_num_seq: 4",
            "max_num_seq",
            "unknown key 'max_num_seq'",
            "did you mean 'max_num_seqs'?",
        ),
        (
            "enable_expert_parallel: true",
            "stages.0.enable_expert_parallel",
            "expert parallel does not run on CPU",
            "enable_expert_parallel: false",
        ),
        (
            "distributed_executor_backend: ray",
            "stages.0.distributed_executor_backend",
            "refuses the Ray executor on CPU",
            "use mp",
        ),
        (
            "tensor_parallel_size: 2",
            "stages.0.tensor_parallel_size",
            "2 vLLM ranks need worker processes",
            "distributed_executor_backend: mp",
        ),
        (
            "role: prefill",
            "stages.0.role",
            "has no decode stage after it",
            "role: decode",
        ),
        ("role: decoder", "role", "not a valid ar role", "did you mean 'decode'"),
        (
            "worker_extension_cls: my.Probe",
            "worker_extension_cls",
            "set by diffserve",
            "attestation probe",
        ),
        (
            "kv_transfer_config: {}",
            "kv_transfer_config",
            "set by diffserve",
            "role: prefill",
        ),
        (
            "default_sampling_params: {temperature: -1}",
            "temperature",
            "outside [0.0, 100.0]",
            None,
        ),
        (
            "default_sampling_params: {max_tokns: 4}",
            "max_tokns",
            "unknown sampling parameter",
            "'max_tokens'",
        ),
        (
            "default_sampling_params: {n: 2}",
            "default_sampling_params.n",
            "one text per request",
            None,
        ),
        ("max_model_len: 8", "max_model_len", "below the minimum 16", None),
        ("warmup: {enabled: true}", "warmup", "is not a boolean", "use true or false"),
    ],
)
def test_bad_ar_keys_are_errors_naming_key_rule_and_fix(
    tmp_path: Path,
    flux_model: Path,
    llm: Path,
    entry: str,
    path: str,
    message: str,
    hint: str | None,
) -> None:
    text = f"stages:\n  - stage_id: 0\n    kind: ar\n    model: llm\n    {entry}\n"
    with pytest.raises(ConfigError) as caught:
        run(deploy_config=deploy(tmp_path, flux_model, text))
    shown = str(caught.value)
    assert path in shown and message in shown, shown
    assert hint is None or hint in shown, shown
    assert "deploy.yaml" in shown


def test_stage_ids_and_models(tmp_path: Path, flux_model: Path, llm: Path) -> None:
    with pytest.raises(ConfigError, match="ar stages have stage_ids \\[1\\]"):
        run(
            deploy_config=deploy(
                tmp_path,
                flux_model,
                "stages:\n  - {stage_id: 1, kind: ar, model: llm}\n",
            )
        )
    with pytest.raises(
        ConfigError,
        match=r"stage_id 2 does not exist in topology 'single' \(1 = diffusion\)",
    ):
        run(
            deploy_config=deploy(
                tmp_path,
                flux_model,
                "stages:\n  - {stage_id: 0, kind: ar, model: llm}\n"
                "  - {stage_id: 2, dtype: float32}\n",
            )
        )
    with pytest.raises(ConfigError, match="names no model"):
        run(
            deploy_config=deploy(
                tmp_path, flux_model, "stages:\n  - {stage_id: 0, kind: ar}\n"
            )
        )
    with pytest.raises(ConfigError, match="LLM directory not found"):
        run(
            deploy_config=deploy(
                tmp_path,
                flux_model,
                "stages:\n  - {stage_id: 0, kind: ar, model: ./nowhere}\n",
            )
        )
    # A hub id, offline first.
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        run(
            deploy_config=deploy(
                tmp_path,
                flux_model,
                "stages:\n  - {stage_id: 0, kind: ar, model: org/llm}\n",
            ),
            env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")},
        )
    with pytest.raises(ConfigError, match="stage kind 'llm'"):
        run(
            deploy_config=deploy(
                tmp_path,
                flux_model,
                "stages:\n  - {stage_id: 0, kind: llm, model: llm}\n",
            )
        )


def test_a_prefill_decode_pair(tmp_path: Path, flux_model: Path, llm: Path) -> None:
    text = (
        "stages:\n  - {stage_id: 0, kind: ar, role: prefill, model: llm}\n"
        "  - {stage_id: 1, kind: ar, role: decode, model: llm, "
        "default_sampling_params: {max_tokens: 8}}\n"
    )
    config = run(deploy_config=deploy(tmp_path, flux_model, text))
    assert [
        (s.role, s.engine_args["enable_prefix_caching"]) for s in config.ar_stages
    ] == [("prefill", False), ("decode", False)]
    assert config.stages[0].stage_id == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="differ in model or kv_connector"):
        run(
            deploy_config=deploy(
                tmp_path,
                flux_model,
                text.replace("role: decode, model: llm", "role: decode, model: other"),
            )
        )


def test_without_vllm_the_error_names_the_extra(
    tmp_path: Path, flux_model: Path, llm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM cannot be uninstalled for one test: its finder answers None, as with no vLLM
    installed."""
    for cached in (
        vllm_args.vllm_root,
        vllm_args.engine_arg_names,
        vllm_args.sampling_param_names,
    ):
        cached.cache_clear()
    monkeypatch.setattr(vllm_args.importlib.util, "find_spec", lambda name: None)
    try:
        with pytest.raises(ConfigError) as caught:
            run(deploy_config=deploy(tmp_path, flux_model, AR))
    finally:
        monkeypatch.undo()
        for cached in (
            vllm_args.vllm_root,
            vllm_args.engine_arg_names,
            vllm_args.sampling_param_names,
        ):
            cached.cache_clear()
    shown = str(caught.value)
    assert "runs on vLLM, which is not installed" in shown and "diffserve[ar]" in shown
    # Once for the engine settings, once for the sampling parameters.
    assert shown.count("not installed") == 2


def test_the_json_schema_takes_ar_entries_and_still_refuses_bad_diffusion_keys() -> (
    None
):
    import jsonschema
    import yaml

    from diffserve.config.json_schema import deploy_json_schema

    schema = deploy_json_schema()
    demo = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "diffserve/assets/demo.yaml").read_text(
            "utf-8"
        )
    )
    for entry in demo["models"]:
        jsonschema.validate({k: v for k, v in entry.items() if k != "name"}, schema)
    for bad in (
        {"stage_id": 0, "max_num_seqs": 4},
        {"stage_id": 0, "kind": "ar", "role": "rewrite"},
        {"stage_id": 1, "kind": "diffusion", "bogus": 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"stages": [bad]}, schema)
