"""The deploy YAML from the issue (and docs/config.md) resolves as documented."""

from __future__ import annotations

import re
from pathlib import Path

from config_helpers import run, write

DOC = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text(
    encoding="utf-8"
)


def _doc_example() -> str:
    return re.search(r"## The deploy YAML\n\n```yaml\n(.*?)```", DOC, re.S).group(1)


def test_documented_example_resolves_on_cpu_and_cuda(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", "server: {max_queue: 8}\nnum_replicas: 1\n")
    deploy = write(tmp_path / "deploy.yaml", _doc_example())
    cpu = run(deploy_config=deploy)
    stage = cpu.stages[0]
    assert (stage.dtype, stage.linear_backend, stage.attention_backend.default) == (
        "float32",
        "torch",
        "sdpa",
    )
    assert stage.enforce_eager is True and stage.distributed_executor_backend == "uni"
    assert (stage.devices, stage.max_batch_size, stage.worker_extension_cls) == (
        (0,),
        4,
        "my_pkg.probe.Probe",
    )
    assert stage.warmup.enabled is True and cpu.server.max_queue == 64
    # The stage's own dtype is in the deploy YAML layer; the cpu block's pipeline-wide
    # dtype outranks it.
    assert cpu.provenance["stages.0.dtype"].layer == "platform"
    assert cpu.provenance["stages.0.attention_backend.default"].layer == "platform"
    cuda = run(deploy_config=deploy, platform="cuda")
    assert cuda.stages[0].dtype == "bfloat16"
    assert cuda.provenance["stages.0.attention_backend.default"].layer == "yaml"
    assert cuda.fingerprint != cpu.fingerprint
