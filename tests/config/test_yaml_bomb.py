"""YAML is bounded: an alias bomb, a huge file or deep nesting is a ConfigError, fast,
never a hang."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diffserve.config.resolve import resolve
from diffserve.config.yaml_lines import MAX_DEPTH, MAX_FILE_BYTES
from diffserve.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _bomb() -> str:
    # "Billion laughs": nine levels of nine aliases each, about 300 bytes expanding to
    # 9**9 leaves.
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    return "extras:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.fixture
def bomb(tmp_path: Path) -> Path:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(), encoding="utf-8")
    assert path.stat().st_size < 1000
    return path


def _resolve_within(seconds: float, **kwargs) -> BaseException | None:
    """Run ``resolve`` on a daemon thread: without the bounds a bomb would hang the
    test, not fail it."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            resolve(model=None, env={}, **kwargs)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert outcome, f"resolve still running after {time.monotonic() - start:.1f}s"
    return outcome[0]


def test_alias_bomb_is_rejected_quickly(bomb: Path) -> None:
    # Lazy imports first: time the YAML alone.
    resolve(model=None, deploy_config={}, env={})
    error = _resolve_within(2.0, deploy_config=bomb)
    assert isinstance(error, ConfigError) and "alias" in str(error)
    assert str(bomb) in str(error)
    assert "remove the anchors" in str(error)


def test_alias_bomb_in_a_base_config_is_rejected(tmp_path: Path, bomb: Path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text(f"base_config: {bomb.name}\nmax_batch_size: 2\n", encoding="utf-8")
    error = _resolve_within(10.0, deploy_config=child)
    assert isinstance(error, ConfigError) and "alias" in str(error)
    assert str(bomb) in str(error)


def test_cli_config_validate_rejects_the_bomb(bomb: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffserve.entrypoints.cli",
            "config",
            "validate",
            "--deploy-config",
            str(bomb),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert str(bomb) in proc.stderr + proc.stdout
    assert "alias" in proc.stderr + proc.stdout


def test_a_few_legitimate_aliases_still_work(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "max_batch_size: &n 2\n"
        "extras:\n  shared: &s {steps: 4, size: 256}\n  copy: "
        "*s\n  again: *s\n  batch: *n\n",
        encoding="utf-8",
    )
    config = resolve(model=None, deploy_config=path, env={})
    stage = config.stage_for_role("diffusion")
    assert stage.extras["copy"] == stage.extras["again"] == {"steps": 4, "size": 256}
    assert stage.max_batch_size == stage.extras["batch"] == 2


def test_too_many_aliases_is_rejected_even_when_small(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "extras:\n  x: &x 1\n  l: [" + ", ".join(["*x"] * 150) + "]\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="more than 100 aliases"):
        resolve(model=None, deploy_config=path, env={})


def test_oversized_file_is_rejected_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(
        "# " + "x" * MAX_FILE_BYTES + "\nmax_batch_size: 2\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="larger than") as info:
        resolve(model=None, deploy_config=path, env={})
    assert str(path) in str(info.value)


def test_deep_nesting_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    depth = MAX_DEPTH + 5
    path.write_text(
        "extras: {k: " + "[" * depth + "1" + "]" * depth + "}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="nested deeper than"):
        resolve(model=None, deploy_config=path, env={})
