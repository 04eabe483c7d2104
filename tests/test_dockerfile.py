"""The Dockerfile, read instruction by instruction (no image can be built here): known
instructions only, a CPU and a CUDA base chosen by a build argument, torch pinned to the
Makefile's version and installed before the package, the package installed the README
way, a non-root user, a health check on /ready, the served port exposed, and every
copied path present in the repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INSTRUCTIONS = {
    "FROM",
    "ARG",
    "ENV",
    "RUN",
    "COPY",
    "WORKDIR",
    "USER",
    "EXPOSE",
    "HEALTHCHECK",
    "ENTRYPOINT",
    "CMD",
    "LABEL",
}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continued lines joined."""
    logical: list[str] = []
    pending = ""
    for line in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    out = []
    for text in logical:
        word, _, rest = text.strip().partition(" ")
        out.append((word, rest.strip()))
    return out


def of(kind: str) -> list[str]:
    return [rest for word, rest in instructions() if word == kind]


def test_every_instruction_is_known_and_upper_case() -> None:
    unknown = [word for word, _ in instructions() if word not in INSTRUCTIONS]
    assert not unknown, unknown


def test_a_build_argument_picks_the_cpu_or_the_cuda_base() -> None:
    stages = {
        rest.split(" AS ")[1].strip(): rest.split(" AS ")[0].strip()
        for rest in of("FROM")
        if " AS " in rest
    }
    assert set(stages) == {"base-cpu", "base-cuda"}, stages
    assert of("FROM")[-1] == "base-${BASE}"
    assert "BASE=cpu" in of("ARG")


def test_torch_is_pinned_to_the_makefiles_version_and_installed_first() -> None:
    pinned = re.search(
        r"^TORCH_VERSION \?= (\S+)$",
        (REPO / "Makefile").read_text(encoding="utf-8"),
        re.M,
    )
    assert pinned is not None
    assert f"TORCH_VERSION={pinned.group(1)}" in of("ARG")
    runs = of("RUN")
    torch_run = next(
        i for i, run in enumerate(runs) if "torch==${TORCH_VERSION}" in run
    )
    package_run = next(
        i
        for i, run in enumerate(runs)
        if re.search(r"pip install .*\"\.\[server,video,otel\]\"", run)
    )
    assert torch_run < package_run
    assert not [
        run for run in runs if re.search(r"pip install[^&]* torch(?!==)", run)
    ], "an unpinned torch"


def test_it_runs_as_a_non_root_user_that_it_creates() -> None:
    users = of("USER")
    assert users and users[-1] not in ("root", "0")
    assert any("useradd" in run and users[-1] in run for run in of("RUN"))
    order = [word for word, _ in instructions()]
    assert order.index("USER") < order.index("ENTRYPOINT")


def test_the_health_check_asks_ready_on_the_served_port() -> None:
    (check,) = of("HEALTHCHECK")
    entrypoint = json.loads(of("ENTRYPOINT")[-1])
    port = entrypoint[entrypoint.index("--port") + 1]
    assert entrypoint[:2] == ["diffserve", "serve"]
    assert f"http://127.0.0.1:{port}/ready" in check
    assert of("EXPOSE") == [port]


@pytest.mark.parametrize("source", ["pyproject.toml", "README.md", "diffserve"])
def test_what_it_copies_exists_and_is_not_ignored(source: str) -> None:
    copied = [part for rest in of("COPY") for part in rest.split()[:-1]]
    assert source in copied
    assert (REPO / source).exists()
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert source not in ignored
