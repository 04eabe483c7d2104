"""Hub ids as models (config/hub.py, config/model_source.py): ``org/name[@revision]``
from the Hugging Face cache offline, bit-identical to the folder; downloads from a hub
(a local one on 127.0.0.1) fetch only what the pipeline loads; gated, missing and
uncached models are errors that say what to do, never a fallback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_hub import FakeHub, commit_of, lay_out_cache, repo_files, serve_hub

from diffserve.config.hub import needed_files, parse_hub_id
from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError

REPO = "tiny-org/tiny-flux"
COMMIT = commit_of("first")
COMMIT_V2 = commit_of("second")


@pytest.fixture
def hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_flux_dir: Path
) -> Path:
    """A cache holding REPO at COMMIT (refs main) and, as tag v2, another model at
    COMMIT_V2."""
    from diffserve.zoo.flux import build_flux_model

    cache = tmp_path / "hub"
    lay_out_cache(cache, REPO, tiny_flux_dir, COMMIT)
    other = build_flux_model("tiny-flux", tmp_path / "other", seed=1)
    lay_out_cache(cache, REPO, other, COMMIT_V2, refs=("v2",))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hub_ids_parse_and_paths_do_not() -> None:
    assert parse_hub_id("black-forest-labs/FLUX.1-schnell") == (
        "black-forest-labs/FLUX.1-schnell",
        "main",
    )
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_hub_id(f"org/name@{COMMIT}") == ("org/name", COMMIT)
    for path in ("./org/name", "/models/flux", "~/flux", "a/b/c", "flux", "org/name@"):
        assert parse_hub_id(path) is None, path


def test_only_the_files_the_pipeline_loads_are_chosen() -> None:
    index = {
        "_class_name": "FluxPipeline",
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "image_encoder": [None, None],
    }
    files = [
        "model_index.json",
        "README.md",
        "flux1-dev.safetensors",
        "ae.safetensors",
        "diffserve_model.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors.index.json",
        "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
        "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
        "transformer/diffusion_pytorch_model.fp16.safetensors",
        "transformer/diffusion_pytorch_model.bin",
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "text_encoder/pytorch_model.bin",
        "tokenizer/vocab.json",
        "tokenizer/merges.txt",
        "tokenizer/tokenizer_config.json",
        "image_encoder/config.json",
        "image_encoder/model.safetensors",
        "vae/config.json",
        "docs/x/y.json",
    ]
    assert needed_files(index, files) == [
        "diffserve_model.json",
        "model_index.json",
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/merges.txt",
        "tokenizer/tokenizer_config.json",
        "tokenizer/vocab.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
        "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
        "transformer/diffusion_pytorch_model.safetensors.index.json",
    ]
    # A component whose weights come from a single file keeps its config, not its
    # weights.
    chosen = needed_files(index, files, skip_weights_of=("transformer",))
    assert "transformer/config.json" in chosen and not any(
        f.endswith("safetensors") for f in chosen if f.startswith("transformer/")
    )


def _image(engine_model: str) -> tuple[np.ndarray, dict]:
    from diffserve import Engine, GenerationRequest

    with Engine(engine_model, dtype="float32", env={}) as engine:
        out = engine.generate(
            GenerationRequest(
                prompt="a fox",
                height=64,
                width=64,
                num_inference_steps=2,
                seed=3,
                output_type="pt",
            )
        )
    return out.images[0].numpy(), out.attestation


def test_a_cached_hub_id_serves_offline_bit_identical_to_its_folder(
    hub_cache: Path, tiny_flux_dir: Path
) -> None:
    from_hub, attestation = _image(REPO)
    from_folder, folder_attestation = _image(str(tiny_flux_dir))
    # The same files through the same loader and kernels.
    assert np.array_equal(from_hub, from_folder)
    assert attestation["model_source"] == {
        "repo_id": REPO,
        "revision": "main",
        "commit": COMMIT,
    }
    # A local folder has no snapshot to attest.
    assert "model_source" not in folder_attestation
    # The same files.
    assert (
        attestation["weights_fingerprint"] == folder_attestation["weights_fingerprint"]
    )


def test_a_revision_picks_its_snapshot(hub_cache: Path) -> None:
    snapshots = hub_cache / f"models--{REPO.replace('/', '--')}" / "snapshots"
    for given, commit, revision in (
        (REPO, COMMIT, "main"),
        (f"{REPO}@v2", COMMIT_V2, "v2"),
        (f"{REPO}@{COMMIT}", COMMIT, COMMIT),
    ):
        config = resolve(model=given, env={})
        assert config.model == str(snapshots / commit), given
        source = config.model_source
        assert source is not None and (
            source.repo_id,
            source.revision,
            source.commit,
        ) == (REPO, revision, commit)
    assert (
        resolve(model=REPO, env={}).fingerprint
        != resolve(model=f"{REPO}@v2", env={}).fingerprint
    )


def test_an_uncached_hub_id_offline_names_the_cache_and_the_fetch_command(
    hub_cache: Path,
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(model="tiny-org/not-downloaded@v3", env={})
    text = str(err.value)
    assert str(hub_cache) in text and "HF_HUB_OFFLINE=1" in text
    assert "hf download tiny-org/not-downloaded --revision v3" in text
    with pytest.raises(ConfigError, match="no revision|not in the Hugging Face cache"):
        resolve(model=f"{REPO}@v9", env={})


def test_explain_shows_the_snapshot_and_a_deploy_files_model_loses_to_the_callers(
    hub_cache: Path, tmp_path: Path, tiny_flux_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    from diffserve.entrypoints.cli import main

    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(f"enforce_eager: true\nmodel: {REPO}@v2\n")
    assert (
        main(
            [
                "config",
                "explain",
                "--deploy-config",
                str(deploy),
                "--platform",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    shown = json.loads(capsys.readouterr().out)["model_source"]
    assert shown == {
        "kind": "hub",
        "given": f"{REPO}@v2",
        "repo_id": REPO,
        "revision": "v2",
        "commit": COMMIT_V2,
        "path": str(
            hub_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT_V2
        ),
        "source": "yaml",
        "location": f"{deploy.resolve()}:2",
    }
    # The caller's MODEL beats the file's model: (as every caller value beats the deploy
    # file).
    config = resolve(model=str(tiny_flux_dir), deploy_config=deploy, env={})
    assert (
        config.model == str(tiny_flux_dir.resolve()) and config.model_source is not None
    )
    assert (
        config.model_source.kind == "directory"
        and config.model_source.origin.layer == "caller"
    )
    # A relative path in a deploy file is read from the file's folder.
    shutil.copytree(tiny_flux_dir, tmp_path / "models" / "mine")
    deploy.write_text("model: models/mine\n")
    assert resolve(deploy_config=deploy, env={}).model == str(
        (tmp_path / "models" / "mine").resolve()
    )


# -- online: a hub on 127.0.0.1
# --------------------------------------------------------------------------


def _online_env(hub: FakeHub, cache: Path) -> dict[str, str]:
    return {
        "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }


def _validate(
    model: str, env: dict[str, str], *flags: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "diffserve.entrypoints.cli",
            "config",
            "validate",
            model,
            "--platform",
            "cpu",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def _published(tiny_flux_dir: Path, root: Path) -> Path:
    """The tiny model as a hub repository holds it: plus a pickle, a variant, a root
    single file and a component the pipeline does not load (none of them may be
    downloaded)."""
    repo = root / "repo"
    shutil.copytree(tiny_flux_dir, repo)
    weights = repo / "transformer" / "diffusion_pytorch_model.safetensors"
    shutil.copy(
        weights, repo / "transformer" / "diffusion_pytorch_model.fp16.safetensors"
    )
    (repo / "transformer" / "diffusion_pytorch_model.bin").write_bytes(b"pickle")
    shutil.copy(weights, repo / "flux1-tiny.safetensors")
    (repo / "image_encoder").mkdir()
    (repo / "image_encoder" / "config.json").write_text("{}")
    index = json.loads((repo / "model_index.json").read_text())
    (repo / "model_index.json").write_text(
        json.dumps({**index, "image_encoder": [None, None]})
    )
    return repo


@pytest.mark.e2e
def test_serve_downloads_only_what_the_pipeline_loads_and_attests_the_commit(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    import openai
    from server_process import ServerProcess

    repo = _published(tiny_flux_dir, tmp_path)
    cache = tmp_path / "cache"
    with serve_hub(FakeHub(repos={REPO: (COMMIT, repo)})) as hub:
        server = ServerProcess(
            [REPO, "--enforce-eager", "--dtype", "float32"],
            tmp_path / "server.log",
            env=_online_env(hub, cache),
        )
        try:
            server.wait_for("/ready")
            client = openai.OpenAI(
                base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120
            )
            assert REPO in [m.id for m in client.models.list().data]
            response = client.images.generate(
                model=REPO,
                prompt="a fox",
                size="64x64",
                extra_body={"num_inference_steps": 2, "seed": 3},
            )
            attestation = response.model_extra["diffserve"]["attestation"]
        finally:
            server.stop()
    assert attestation["model_source"] == {
        "repo_id": REPO,
        "revision": "main",
        "commit": COMMIT,
    }
    expected = sorted(
        f
        for f in repo_files(repo)
        if not f.endswith((".bin", ".fp16.safetensors"))
        and f != "flux1-tiny.safetensors"
        and not f.startswith("image_encoder/")
    )
    assert hub.downloaded(REPO) == expected, hub.requests
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert sorted(repo_files(snapshot)) == expected


@pytest.mark.e2e
def test_gated_missing_and_unreachable_hubs(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    gated = "tiny-org/gated"
    # Cached, yet a gated answer is not a fallback.
    lay_out_cache(cache, gated, tiny_flux_dir, COMMIT)
    lay_out_cache(cache, REPO, tiny_flux_dir, COMMIT)
    with serve_hub(
        FakeHub(repos={REPO: (COMMIT, tiny_flux_dir)}, gated={gated})
    ) as hub:
        env = _online_env(hub, cache)
        for model, needle in (
            (gated, "is gated"),
            ("tiny-org/absent", "not found"),
            (f"{REPO}@nope", "has no revision 'nope'"),
        ):
            proc = _validate(model, env)
            assert proc.returncode == 1 and needle in proc.stderr, (model, proc.stderr)
            assert "Traceback" not in proc.stderr
    # The hub is gone (nothing listens there now): the cached snapshot serves, with a
    # warning.
    proc = _validate(REPO, env)
    assert proc.returncode == 0 and "cannot be reached" in proc.stderr, proc.stderr


@pytest.mark.e2e
def test_a_transformer_from_a_single_file_is_not_downloaded(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    from diffserve.zoo.flux_checkpoints import write_single_file

    single = write_single_file(tiny_flux_dir, tmp_path / "flux1-tiny.safetensors")
    with serve_hub(FakeHub(repos={REPO: (COMMIT, tiny_flux_dir)})) as hub:
        proc = _validate(
            REPO, _online_env(hub, tmp_path / "cache"), "--transformer", str(single)
        )
    assert proc.returncode == 0, proc.stderr
    downloaded = hub.downloaded(REPO)
    assert (
        "transformer/config.json" in downloaded
        and "vae/diffusion_pytorch_model.safetensors" in downloaded
    )
    assert not [
        f
        for f in downloaded
        if f.startswith("transformer/") and f.endswith(".safetensors")
    ], downloaded
