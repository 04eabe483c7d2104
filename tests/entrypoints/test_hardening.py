"""Hardening of the HTTP layer that needs no model: generic 500 bodies, /v1/config
redaction, API key sources, PNG metadata caps, JSON nesting and non-finite floats."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from diffserve.config.resolve import resolve
from diffserve.entrypoints.api_errors import to_api_error
from diffserve.entrypoints.api_key import resolve_api_key
from diffserve.entrypoints.openai.app import create_app
from diffserve.entrypoints.openai.config_view import REDACTED, config_view
from diffserve.entrypoints.openai.encoding import MAX_METADATA_CHARS, encode_image
from diffserve.entrypoints.openai.hosts import HostAllowList
from diffserve.entrypoints.openai.images import ImagesHandler
from diffserve.entrypoints.openai.protocol import parse_body
from diffserve.errors import ConfigError, RequestError


def test_500_body_is_generic_and_the_log_has_the_id(monkeypatch, caplog) -> None:
    async def boom(self, request):
        raise RuntimeError("secret detail /srv/models/private")

    monkeypatch.setattr(ImagesHandler, "create", boom)

    def factory():
        raise RuntimeError("no engine in this test")

    app = create_app(engine_factory=factory)
    with caplog.at_level(logging.ERROR), TestClient(app) as client:
        resp = client.post(
            "/v1/images/generations",
            json={"prompt": "x"},
            headers={"X-Request-Id": "abc-123"},
        )
    error = resp.json()["error"]
    assert resp.status_code == 500 and error["code"] == "internal_error"
    assert (
        "secret" not in resp.text
        and "/srv" not in resp.text
        and "abc-123" in error["message"]
    )
    assert resp.headers["x-request-id"] == "abc-123"
    assert any("abc-123" in r.getMessage() and r.exc_info for r in caplog.records)
    # No client id: a generated one.
    assert "req-" in to_api_error(RuntimeError("x")).message


def test_v1_config_redacts_paths_and_extras(tiny_flux_dir, tmp_path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("server:\n  max_queue: 3\nenforce_eager: true\n")
    cfg = resolve(
        model=str(tiny_flux_dir),
        deploy_config=str(deploy),
        stage_overrides={0: {"extras": {"token": "s3cr3t"}}},
    )
    text = str(config_view(cfg))
    assert (
        str(tmp_path) not in text
        and str(tiny_flux_dir) not in text
        and "s3cr3t" not in text
    )
    doc = config_view(cfg)
    assert doc["deploy_files"] == ["deploy.yaml"] and doc["pipeline"][
        "server.max_queue"
    ]["location"].endswith("deploy.yaml:2")
    assert doc["stages"][0]["fields"]["extras.token"]["value"] == REDACTED
    # Server.expose_config: true.
    assert str(tmp_path) in str(config_view(cfg, expose=True))
    # A job store's password never leaves, even exposed; a bad store URL is a config
    # error naming the fix.
    stored = resolve(
        model=str(tiny_flux_dir),
        overrides={"job_store": "postgresql://bob:p@ss@db:5432/jobs"},
    )
    assert stored.server.job_store == "postgresql+psycopg://bob:p@ss@db:5432/jobs"
    for expose in (False, True):
        assert "p@ss" not in str(config_view(stored, expose=expose))
    assert (
        config_view(stored, expose=True)["pipeline"]["server.job_store"]["value"]
        == f"postgresql+psycopg://bob:{REDACTED}@db:5432/jobs"
    )
    with pytest.raises(ConfigError, match="mysql"):
        resolve(model=str(tiny_flux_dir), overrides={"job_store": "mysql://db/jobs"})


def test_api_key_sources(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    assert resolve_api_key(None, str(key_file), {}) == "from-file"
    assert resolve_api_key(None, None, {"DIFFSERVE_API_KEY": "from-env"}) == "from-env"
    assert resolve_api_key("flag", None, {}) == "flag"
    assert resolve_api_key(None, None, {}) is None
    for args in (
        ("flag", str(key_file), {}),
        ("flag", None, {"DIFFSERVE_API_KEY": "e"}),
        (None, str(key_file), {"DIFFSERVE_API_KEY": "e"}),
    ):
        with pytest.raises(ConfigError, match="exactly one"):
            resolve_api_key(*args)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        resolve_api_key(None, str(tmp_path / "empty"), {})


def test_serve_refuses_two_key_sources_before_loading(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("k")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffserve.entrypoints.cli",
            "serve",
            "--api-key",
            "a",
            "--api-key-file",
            str(key_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "exactly one" in proc.stderr


def test_png_metadata_is_capped() -> None:
    blob = encode_image(
        Image.new("RGB", (16, 16)),
        "png",
        metadata={"prompt": "p" * 50_000, "seed": "1"},
    )
    text = Image.open(io.BytesIO(blob)).text
    assert len(text["prompt"]) == MAX_METADATA_CHARS and text["prompt"].endswith(
        "[truncated]"
    )
    assert text["seed"] == "1"


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 5000 + b"]" * 5000,
        b'{"prompt": ' + b'{"a":' * 3000 + b"1" + b"}" * 3001,
        b'{"prompt": "' + b"[" * 5000 + b'"',
    ],
)
def test_deep_nesting_is_invalid_json(raw: bytes) -> None:
    with pytest.raises(RequestError) as info:
        parse_body(raw)
    assert info.value.code == "invalid_json"


@pytest.mark.parametrize("field", ["guidance_scale", "true_cfg_scale"])
@pytest.mark.parametrize("value", [b"1e400", b"-1e400", b"NaN", b"Infinity", b"100.01"])
def test_non_finite_or_huge_floats_are_invalid(field: str, value: bytes) -> None:
    with pytest.raises(RequestError) as info:
        parse_body(b'{"prompt": "x", "' + field.encode() + b'": ' + value + b"}")
    assert (info.value.code, info.value.param) == ("invalid_value", field)


def test_host_allow_list() -> None:
    hosts = HostAllowList(("localhost", "127.0.0.1:8000", "*.corp.example", "[::1]"))
    for ok in (
        "localhost",
        "LOCALHOST:9",
        "127.0.0.1:8000",
        "a.corp.example",
        "a.b.corp.example:1",
        "[::1]:80",
    ):
        assert hosts.allows(ok), ok
    for bad in (
        None,
        "",
        "127.0.0.1:8001",
        "127.0.0.1",
        "corp.example",
        "evilcorp.example",
        "localhost.evil",
    ):
        assert not hosts.allows(bad), bad
    assert HostAllowList(()).allows("anything")
