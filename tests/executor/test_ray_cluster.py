"""The ray executor on multi-node Ray clusters on this machine, every node and
rendezvous on 127.0.0.1.

* Three nodes (``ray.cluster_utils.Cluster``: separate raylets, custom resources) and an
  engine with two replicas of a
  two-rank Ulysses group, through ``ray_address``: the replicas land on different nodes
  although both would fit on one, each replica's ranks on one node (``STRICT_PACK``),
  attested by the node id each rank reads inside its actor; a node removed while both
  replicas run a request takes out its replica only: that request fails with
  ``EngineDeadError``, the other finishes, later requests are served by the surviving
  node, health is degraded.
* ``ray_address: auto``: ``diffserve generate`` joins a ``ray start --head`` cluster
  started here (token
  authentication on, a private token) and its rank runs on that cluster's head node.
* Which addresses diffserve joins as 127.0.0.1 (Ray would rewrite loopback to the
  machine's routable address).

Both run the cluster in processes of their own (a fresh Ray, whatever this process has),
in a session of their own so that Ray's reaper (which kills its process group when its
parent dies) can only reach them, and bounded in time; every process of the cluster is
stopped by its temp directory, never by ``ray stop`` (which stops every Ray of the user,
other tests' included).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import cmdline

pytest.importorskip("ray")

pytestmark = pytest.mark.e2e

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
VENV_BIN = Path(sys.executable).parent


def cluster_env(temp_dir: Path) -> dict[str, str]:
    """The environment of a cluster's processes and its drivers: Ray's files under
    ``temp_dir`` only (never /tmp/ray, where another Ray may live), no idle workers
    started ahead for a driver (every rank actor starts a process of its own: prestarted
    ones would only take the two cores), one torch thread per actor (four actors on two
    cores: two each would thrash, and the actors follow the driver's
    OMP_NUM_THREADS)."""
    env = dict(os.environ)
    env.update(
        RAY_TMPDIR=str(temp_dir),
        RAY_prestart_worker_first_driver="0",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    )
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def ray_temp_dir() -> Iterator[Path]:
    """A short private directory (Ray's unix sockets must fit 107 bytes, pytest's
    tmp_path may not) whose every process is stopped on the way out, whatever
    happened."""
    path = Path(tempfile.mkdtemp(prefix="dsray-", dir="/tmp"))
    try:
        yield path
    finally:
        left = stop_processes_under(path)
        assert not left, f"Ray processes outlived the test: {left}"
        subprocess.run(["rm", "-rf", str(path)], check=False)


def processes_under(path: Path) -> list[int]:
    """Live processes whose command line names ``path`` (every Ray process of a cluster
    there names its session directory: GCS, raylets, agents, workers)."""
    mine = os.getpid()
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit()
        and int(entry) != mine
        and str(path) in cmdline(int(entry))
        and _alive(int(entry))
    ]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_processes_under(path: Path, grace_s: float = 1.0) -> list[int]:
    """SIGTERM every process of the cluster under ``path``, SIGKILL what is left after
    ``grace_s``; returns the ones still alive after that (none, normally)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0)):
        pids = processes_under(path)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while processes_under(path) and time.monotonic() < deadline:
            time.sleep(0.1)
    return processes_under(path)


def run_bounded(
    args: list[str], env: dict[str, str], timeout: float, cwd: Path
) -> subprocess.CompletedProcess:
    """Run ``args`` in a session of its own; on a timeout, kill that whole session
    (Ray's processes included)."""
    proc = subprocess.Popen(
        args,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(args[:4])}... ran past {timeout:.0f}s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def test_ray_replicas_spread_ranks_packed_a_lost_node_takes_out_its_replica_only(
    tiny_flux_dir: Any,
) -> None:
    with ray_temp_dir() as temp_dir:
        result = temp_dir / "result.json"
        proc = run_bounded(
            [
                sys.executable,
                str(TESTS / "ray_cluster_driver.py"),
                str(tiny_flux_dir),
                str(result),
            ],
            cluster_env(temp_dir),
            timeout=240,
            cwd=temp_dir,
        )
        facts = json.loads(result.read_text()) if result.is_file() else {}
        assert proc.returncode == 0 and facts.get("ok"), (
            facts.get("error"),
            proc.stdout[-4000:],
        )
    print("timings (s since the driver started):", facts["timings"])

    # Three nodes, each its own raylet on 127.0.0.1 with its own resource; each could
    # hold both replicas.
    head = facts["cluster"]["head"]
    nodes = {n["id"]: n for n in facts["nodes"]}
    assert len(nodes) == 3 and {n["address"] for n in nodes.values()} == {"127.0.0.1"}
    assert sorted(
        name
        for n in nodes.values()
        for name in n["resources"]
        if name.startswith("test_node_")
    ) == ["test_node_0", "test_node_1", "test_node_2"]
    # 2 replicas x 2 ranks x {"CPU": 1}.
    assert all(n["resources"]["CPU"] >= 4 for n in nodes.values())
    assert facts["gcs"].startswith("127.0.0.1:")

    # Ranks packed, replicas spread: by the node id every rank read inside its own
    # actor.
    ranks = facts["ranks"]
    assert sorted((r["replica"], r["rank"]) for r in ranks) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    node_of = {}
    for replica in (0, 1):
        # Both ranks on one node.
        (node,) = {r["node"] for r in ranks if r["replica"] == replica}
        node_of[replica] = node
    assert node_of[0] != node_of[1] and set(node_of.values()) <= set(nodes)
    groups = facts["groups"]
    assert len(groups) == 2 and {g["strategy"] for g in groups} == {"STRICT_PACK"}
    assert sorted(tuple(g["nodes"]) for g in groups) == sorted(
        (node,) for node in node_of.values()
    )
    # The process groups meet on loopback, on their replica's node.
    for replica in (0, 1):
        (init_method,) = {r["init_method"] for r in ranks if r["replica"] == replica}
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", init_method), init_method
    assert {r["node_ip"] for r in ranks} == {"127.0.0.1"}
    # Requests are served on both nodes, each by the replica that lives there.
    served = facts["served"]
    assert {s["replica"] for s in served} == {0, 1}
    assert all(s["node"] == node_of[s["replica"]] for s in served)
    # Three more groups asked for at one instant from three threads (as replicas are
    # built) beside the engine's two: each goes to a node of its own, the empty node
    # first (a choice under a lock, counting groups Ray has not placed yet).
    concurrent = facts["concurrent_groups"]
    assert all(
        g["placed"] and g["strategy"] == "STRICT_PACK" and len(g["nodes"]) == 1
        for g in concurrent
    )
    assert sorted(g["nodes"][0] for g in concurrent) == sorted(nodes)

    # A node is removed while both replicas run a request: its replica goes, the other
    # finishes and serves on.
    removal = facts["removal"]
    lost = next(replica for replica, node in node_of.items() if node == removal["node"])
    survivor = 1 - lost
    assert removal["node"] != head
    failed = [o for o in removal["long_requests"] if "error" in o]
    finished = [o for o in removal["long_requests"] if "replica" in o]
    assert len(failed) == 1 and failed[0]["dead_error"], removal
    assert (
        f"replica {lost} of 2 was lost" in failed[0]["message"]
        and "retry the request" in failed[0]["message"]
    )
    assert finished == [
        {
            "replica": survivor,
            "node": node_of[survivor],
            "finished_s": finished[0]["finished_s"],
        }
    ]
    health = facts["health_after"]
    assert (
        health["replicas_live"],
        health["num_replicas"],
        health["is_dead"],
        health["is_ready"],
        health["check_health"],
    ) == (1, 2, False, True, "ok")
    assert [(s["replicas_live"], s["replicas"]) for s in health["stages"]] == [(1, 2)]
    assert facts["served_after"] and all(
        s == {"replica": survivor, "node": node_of[survivor]}
        for s in facts["served_after"]
    )
    assert facts["shutdown_s"] < 15


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ray_address_auto_joins_a_ray_start_cluster(tiny_flux_dir: Any) -> None:
    begin = time.monotonic()
    with ray_temp_dir() as temp_dir:
        port = _free_port()
        env = cluster_env(temp_dir)
        # Ray 2.60 turns on token authentication for `ray start`; a driver that names
        # the cluster (RAY_ADDRESS) must then say so itself. A private token, so nothing
        # of the user's ~/.ray is read or written.
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        # `ray start` keeps 127.0.0.1 only in Ray's single-machine mode (else: the
        # machine's routable address).
        head_env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        started = run_bounded(
            [
                str(VENV_BIN / "ray"),
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                f"--dashboard-port={_free_port()}",
                f"--dashboard-agent-listen-port={_free_port()}",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir / 'ray'}",
            ],
            head_env,
            timeout=90,
            cwd=temp_dir,
        )
        assert started.returncode == 0, started.stdout[-4000:]
        started_s = time.monotonic() - begin
        raylets = [
            pid
            for pid in processes_under(temp_dir)
            if "/raylet/raylet " in cmdline(pid)
        ]
        assert len(raylets) == 1, raylets
        (head_node,) = re.findall(r"--node_id=([0-9a-f]+)", cmdline(raylets[0]))
        assert "--node_ip_address=127.0.0.1" in cmdline(raylets[0])

        child_env = {
            **env,
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            "DIFFSERVE_LOG_LEVEL": "INFO",
        }
        out_png = temp_dir / "out.png"
        generated = run_bounded(
            [
                sys.executable,
                "-m",
                "diffserve.entrypoints.cli",
                "generate",
                str(tiny_flux_dir),
                "a fox",
                "-o",
                str(out_png),
                "--seed",
                "3",
                "--steps",
                "2",
                "--size",
                "64x64",
                "--no-progress",
                "--distributed-executor-backend",
                "ray",
                "--ray-address",
                "auto",
                "--dtype",
                "float32",
                "--enforce-eager",
            ],
            child_env,
            timeout=150,
            cwd=temp_dir,
        )
        assert generated.returncode == 0, generated.stdout[-4000:]
        assert out_png.is_file() and "wrote " in generated.stdout
        # It joined that cluster (as 127.0.0.1, not the machine's other address) and its
        # rank ran on its head node.
        assert (
            f"Connecting to existing Ray cluster at address: 127.0.0.1:{port}"
            in generated.stdout
        )
        ready = re.findall(
            r"ray executor: 1 worker\(s\) ready, pids=\[\d+\], nodes=\['([0-9a-f]+)'\]",
            generated.stdout,
        )
        assert ready == [head_node], generated.stdout[-4000:]
        generated_s = time.monotonic() - begin
    print(
        f"ray start {started_s:.1f}s, generate done at {generated_s:.1f}s, "
        f"stopped at {time.monotonic() - begin:.1f}s"
    )


@pytest.mark.parametrize(
    ("address", "env", "loopback"),
    [
        ("127.0.0.1:6379", None, True),
        ("localhost:6379", None, True),
        ("[::1]:6379", None, True),
        ("127.0.0.2:6379", None, True),
        ("192.0.2.7:6379", None, False),
        ("head.example:6379", None, False),
        (
            "ray://127.0.0.1:10001",
            None,
            False,
        ),  # Ray Client: the driver runs on the cluster, not here
        ("auto", "127.0.0.1:41000", True),
        ("auto", "192.0.2.7:6379", False),
    ],
)
def test_which_cluster_addresses_are_joined_on_loopback(
    address: str, env: str | None, loopback: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``auto`` reads RAY_ADDRESS first (as ray.init does), without looking for a local
    # cluster then.
    from diffserve.executor.ray_connect import (
        bootstrap_is_loopback as _bootstrap_is_loopback,
    )

    if env is not None:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert _bootstrap_is_loopback(address) is loopback
