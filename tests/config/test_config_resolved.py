"""ResolvedConfig: frozen, picklable, role lookup, explain shape, cheap import."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from config_helpers import run, write

from diffserve.config import ResolvedConfig, StageConfig, resolve
from diffserve.config.explain import explain_dict
from diffserve.errors import ConfigError


def _sample(tmp_path: Path) -> ResolvedConfig:
    deploy = write(
        tmp_path / "d.yaml",
        """
        topology: split_text_encoder
        server: {max_n: 2}
        stages:
          - {stage_id: 1, attention_backend: {default: sdpa, single_block: math},
             extras: {k: [1, {a: b}]}}
        """,
    )
    return run(
        deploy_config=deploy, overrides={"worker_extension_cls": "my_pkg.probe.Probe"}
    )


def test_frozen_and_picklable(tmp_path: Path) -> None:
    cfg = _sample(tmp_path)
    clone = pickle.loads(pickle.dumps(cfg))
    assert clone == cfg and clone.fingerprint == cfg.fingerprint
    assert clone.provenance == cfg.provenance
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.topology = "single"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.stages[0].dtype = "float32"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.provenance["x"] = None  # type: ignore[index]
    assert hash(cfg.stages[1]) == hash(clone.stages[1])


def test_public_names_and_role_lookup(tmp_path: Path) -> None:
    cfg = _sample(tmp_path)
    assert resolve is not None and isinstance(cfg.stages[0], StageConfig)
    assert (
        cfg.server.max_n == 2
        and cfg.server.max_queue == 64
        and cfg.server.max_pixels == 1048576
    )
    diffusion = cfg.stage_for_role("diffusion")
    assert diffusion.stage_id == 1
    assert diffusion.attention_backend.for_role("single_block") == "math"
    assert diffusion.attention_backend.for_role("double_block") == "sdpa"
    assert diffusion.worker_extension_cls == "my_pkg.probe.Probe"
    with pytest.raises(ConfigError, match="unknown attention role"):
        diffusion.attention_backend.for_role("cross")
    with pytest.raises(ConfigError, match="no 'vae' stage"):
        cfg.stage_for_role("vae")


def test_explain_json_shape(tmp_path: Path) -> None:
    cfg = _sample(tmp_path)
    doc = json.loads(json.dumps(explain_dict(cfg)))
    assert doc["fingerprint"] == cfg.fingerprint and doc["warnings"] == []
    assert [s["stage_id"] for s in doc["stages"]] == [0, 1]
    fields = doc["stages"][1]["fields"]
    assert fields["attention_backend.single_block"] == {
        "value": "math",
        "source": "yaml",
        "location": f"{(tmp_path / 'd.yaml').resolve()}:4",
    }
    assert fields["worker_extension_cls"]["source"] == "cli"
    assert fields["dtype"] == {
        "value": "float32",
        "source": "platform-default",
        "location": None,
    }
    assert fields["extras.k"]["value"] == [1, {"a": "b"}]
    sources = {e["source"] for s in doc["stages"] for e in s["fields"].values()}
    assert sources <= {
        "default",
        "platform-default",
        "model",
        "yaml",
        "platform",
        "env",
        "cli",
        "cli_stage",
    }
    assert doc["pipeline"]["server.max_n"]["source"] == "yaml"


def test_dict_deploy_config_is_cited_as_dict() -> None:
    cfg = run(deploy_config={"stages": [{"stage_id": 0, "linear_backend": "TORCH"}]})
    assert cfg.stages[0].linear_backend == "torch"
    assert cfg.provenance["stages.0.linear_backend"].location == "<dict>"


def test_import_stays_cheap() -> None:
    code = (
        "import sys, diffserve.config.resolve, diffserve.config.cli_args;"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers') "
        "if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_platform_none_detects_without_error() -> None:
    cfg = resolve(env={})
    assert cfg.platform in ("cpu", "cuda", "rocm", "xpu", "mps")
