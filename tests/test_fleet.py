"""The fleet backend on a real local Ray cluster (two nodes on this machine) and the real Docker engine.

Nothing is mocked: `ray start` runs a head and a worker node as subprocesses, cko runs its CLI as
the controller, the containers run in the engine. The per-device combination tests need neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from cko_perf.runner.errors import CkoError
from cko_perf.runner.fleet import Placement, placement_for
from cko_perf.runner.fleet.wire import WirePlan, plan_from_wire, plan_to_wire
from cko_perf.runner.invocation import Plan
from cko_perf.runner.sandbox import Mount
from cko_perf.runner.workflow.per_device import DeviceAnalysis, analyse_device, combine_per_device
from tests.conftest import CKO, ROOT, run_cko

RAY = Path(sys.executable).parent / "ray"
NODE_RESOURCES = '{"gpu:FAKE": 2, "cko_slot": 2}'  # per node: four fake GPUs need both nodes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RAY), *args], capture_output=True, text=True, env=env, timeout=120)


class Cluster:
    def __init__(self, address: str, client: str, scratch: Path, env: dict[str, str]) -> None:
        self.address, self.client, self.scratch, self.env = address, client, scratch, env


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    short = Path(tempfile.mkdtemp(prefix="ckoray-", dir="/tmp"))  # Ray's socket paths must stay short
    scratch = short / "scratch"
    env = os.environ | {
        "CKO_FLEET_SCRATCH": str(scratch),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    port, client_port = _free_port(), _free_port()
    common = [
        "--num-cpus",
        "1",
        "--resources",
        NODE_RESOURCES,
        "--object-store-memory",
        "200000000",
        "--disable-usage-stats",
    ]
    try:
        head = _ray(
            "start",
            "--head",
            "--port",
            str(port),
            "--ray-client-server-port",
            str(client_port),
            "--include-dashboard=false",
            "--temp-dir",
            str(short / "ray"),
            *common,
            env=env,
        )
        assert head.returncode == 0, head.stderr[-2000:]
        worker = _ray("start", "--address", f"127.0.0.1:{port}", *common, env=env)
        assert worker.returncode == 0, worker.stderr[-2000:]
        c = Cluster(f"127.0.0.1:{port}", f"ray://127.0.0.1:{client_port}", scratch, env)
        deadline = time.monotonic() + 60
        while True:
            r = run_cko("fleet", "status", "--fleet", c.address, "--no-probe", "--json", env=env, timeout=60)
            if r.code == 0 and sum(n["alive"] for n in r.json["nodes"]) == 2:
                break
            assert time.monotonic() < deadline, (
                f"cluster did not come up: {r.stdout[-500:]} {r.stderr[-800:]}"
            )
            time.sleep(1)
        yield c
    finally:
        _stop_cluster(short, f"CKO_FLEET_SCRATCH={scratch}")
        subprocess.run(["rm", "-rf", str(short)], check=False)


def _stop_cluster(root: Path, marker: str) -> None:
    """End this cluster's processes only: `ray stop` would end every Ray process on the machine.

    Ours: a process that writes a log under this module's Ray temp dir (GCS, raylets, their agents,
    workers), or that inherited the env of our `ray start` (a watchdog).
    """
    mine = [p for p in _pids() if _ours(p, str(root) + "/", marker.encode())]
    for pid in mine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while [p for p in mine if _state(p) not in ("Z", "")] and time.monotonic() < deadline:
        time.sleep(0.1)


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and int(p.name) != os.getpid()]


def _ours(pid: int, root: str, marker: bytes) -> bool:
    try:
        if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return True
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith(root):
                return True
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _containers(label: str) -> list:
    import docker

    client = docker.from_env()
    while True:
        try:
            return client.containers.list(all=True, filters={"label": label})
        except docker.errors.NotFound:  # removed between the listing and its inspection: list again
            continue


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _max_overlap(windows: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in windows] + [(e, -1) for _, e in windows], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, step in events:
        cur += step
        best = max(best, cur)
    return best


def _verify(store: Path, env: dict[str, str]) -> dict:
    v = run_cko("verify", "--json", store=store, env=env)
    assert v.code == 0 and v.json["ok"], v.stdout
    return v.json


# -- on the cluster -------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_status_lists_both_nodes_ready(cluster: Cluster) -> None:
    r = run_cko("fleet", "status", "--fleet", cluster.address, "--json", env=cluster.env, timeout=120)
    assert r.code == 0, r.stderr[-1500:]
    nodes = [n for n in r.json["nodes"] if n["alive"]]
    assert len(nodes) == 2
    for n in nodes:
        assert n["resources"]["gpu:FAKE"] == 2 and n["resources"]["cko_slot"] == 2
        assert n["cko"]["ready"], n["cko"]["blockers"]
        assert n["cko"]["engine"]["ok"] and n["cko"]["images"]["cpu"]["ok"]
        assert n["cko"]["scratch"] == str(cluster.scratch)
    assert r.json["totals"]["gpu:FAKE"] == 4


@pytest.mark.docker
@pytest.mark.slow
def test_five_invocations_on_four_fake_gpus_run_four_at_once_and_land_verified(
    cluster: Cluster, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    plans = {
        "plans": [
            {
                "command": ["sh", "-c", f"sleep 6; echo ok-{i} > /cko/out/x"],
                "label": f"screen-{i}",
                "resources": {"gpu:FAKE": 1},
                "timeout_s": 120,
            }
            for i in range(5)
        ]
    }
    pf = tmp_path / "plans.json"
    pf.write_text(json.dumps(plans))
    t0 = time.monotonic()
    r = run_cko(
        "fleet",
        "run",
        "--fleet",
        cluster.address,
        "--plans",
        str(pf),
        "--json",
        store=store,
        env=cluster.env,
        timeout=240,
    )
    elapsed = time.monotonic() - t0
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    invs = r.json["invocations"]
    assert [i["label"] for i in invs] == [f"screen-{i}" for i in range(5)]
    assert all(i["state"] == "succeeded" for i in invs), invs
    # Ray gives each invocation one of the four fake GPUs: four at once, never five.
    windows = [(_ts(i["started_at"]), _ts(i["ended_at"])) for i in invs]
    assert _max_overlap(windows) == 4, (windows, elapsed)
    assert len({i["node"]["node_id"] for i in invs}) == 2  # two fake GPUs per node: both nodes ran some
    for n, i in enumerate(invs):
        d = store / "invocations" / i["id"]
        res = json.loads((d / "result.json").read_text())
        assert res["state"] == "succeeded" and res["identity"]["image"]["name"] == "cpu"
        (out,) = res["outputs"]
        assert out["name"] == "x"
        obj = store / "objects" / "sha256" / out["sha256"][:2] / out["sha256"]
        assert obj.read_bytes() == f"ok-{n}\n".encode()
        assert not _containers(f"org.cko.invocation={i['id']}")
    v = _verify(store, cluster.env)
    assert v["checked"]["invocations"] == 5 and v["checked"]["ledger_entries"] == 5


@pytest.mark.docker
@pytest.mark.slow
def test_worker_killed_mid_run_is_abandoned_and_leaves_no_container(cluster: Cluster, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "cko_perf",
        "exec",
        "--fleet",
        cluster.address,
        "--json",
        "--store",
        str(store),
        "--",
        "sh",
        "-c",
        "sleep 60",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    try:
        deadline = time.monotonic() + 60
        mine: list = []
        while not mine:
            assert time.monotonic() < deadline and proc.poll() is None, "the container never started"
            mine = [
                c
                for c in _containers("org.cko.invocation")
                if c.labels.get("org.cko.store", "").startswith(str(cluster.scratch))
            ]
            time.sleep(0.2)
        (container,) = mine
        inv_id = container.labels["org.cko.invocation"]
        worker_pid = int(container.labels["org.cko.controller-pid"])  # the Ray worker running the sandbox
        cmdline = Path(f"/proc/{worker_pid}/cmdline").read_bytes().decode(errors="replace")
        assert "default_worker" in cmdline or "ray::" in cmdline, cmdline
        os.kill(worker_pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    doc = json.loads(out)
    assert doc["id"] == inv_id and doc["state"] == "abandoned"
    assert doc["cleanup"]["container_removed"] is True
    res = json.loads((store / "invocations" / inv_id / "result.json").read_text())
    assert res["state"] == "abandoned" and "lost" in res["reason"]
    events = [
        json.loads(x)["event"]
        for x in (store / "invocations" / inv_id / "events.jsonl").read_text().splitlines()
    ]
    assert events[0] == "fleet_started" and events[-1] == "abandoned"
    deadline = time.monotonic() + 30
    while _containers(f"org.cko.invocation={inv_id}"):
        assert time.monotonic() < deadline, "the killed worker's container is still there"
        time.sleep(0.25)
    _verify(store, cluster.env)
    deadline = time.monotonic() + 30
    while any(p.name.startswith("flt-") for p in cluster.scratch.iterdir()):
        assert time.monotonic() < deadline, f"task dirs left on the node: {list(cluster.scratch.iterdir())}"
        time.sleep(0.25)


@pytest.mark.docker
@pytest.mark.slow
def test_plan_timeout_holds_on_the_fleet(cluster: Cluster, tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = run_cko(
        "exec",
        "--fleet",
        cluster.address,
        "--timeout",
        "2",
        "--json",
        "--",
        "sh",
        "-c",
        "sleep 30",
        store=store,
        env=cluster.env,
        timeout=120,
    )
    assert r.code == 4, r.stderr[-1500:]
    assert r.json["state"] == "timed_out" and r.json["duration_s"] < 15
    assert r.json["cleanup"]["container_removed"] is True
    assert not _containers(f"org.cko.invocation={r.json['id']}")
    _verify(store, cluster.env)


@pytest.mark.docker
@pytest.mark.slow
def test_ray_client_address_and_shipped_inputs(cluster: Cluster, tmp_path: Path) -> None:
    src = tmp_path / "inputs"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("shipped\n")
    req = tmp_path / "req.json"
    req.write_text('{"k": 1}\n')
    store = tmp_path / "store"
    r = run_cko(
        "exec",
        "--fleet",
        cluster.client,
        "--json",
        "--mount",
        f"{src}:/cko/in",
        "--mount",
        f"{req}:/cko/request/r.json",
        "--",
        "sh",
        "-c",
        "cat /cko/in/sub/a.txt /cko/request/r.json > /cko/out/y; touch /cko/in/w 2>/dev/null "
        "&& echo writable || echo read-only",
        store=store,
        env=cluster.env,
        timeout=120,
    )
    assert r.code == 0, r.stderr[-1500:]
    assert r.json["stdout_tail"].strip() == "read-only"
    (out,) = r.json["outputs"]
    assert (
        store / "objects" / "sha256" / out["sha256"][:2] / out["sha256"]
    ).read_bytes() == b'shipped\n{"k": 1}\n'
    # The request records what was mounted on the node: the shipped copy under its scratch, never the source.
    req_doc = json.loads((store / "invocations" / r.json["id"] / "request.json").read_text())
    assert all(m["source"].startswith(str(cluster.scratch)) for m in req_doc["mounts"])
    _verify(store, cluster.env)


@pytest.mark.docker
@pytest.mark.slow
def test_policy_refusal_is_recorded_by_the_controller(cluster: Cluster, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("max_timeout_s: 10\n")
    store = tmp_path / "store"
    r = run_cko(
        "exec",
        "--fleet",
        cluster.address,
        "--policy",
        str(policy),
        "--timeout",
        "100",
        "--json",
        "--",
        "true",
        store=store,
        env=cluster.env,
        timeout=120,
    )
    assert r.code == 3, r.stdout + r.stderr[-1500:]
    inv = r.json["detail"]["invocation"]
    res = json.loads((store / "invocations" / inv / "result.json").read_text())
    assert res["state"] == "refused"
    _verify(store, cluster.env)


@pytest.mark.docker
@pytest.mark.slow
def test_node_lost_mid_run_is_abandoned_and_its_watchdog_removes_the_container(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A third node that only this test's invocation can use (resource cko_victim); its raylet is killed.
    started = _ray(
        "start",
        "--address",
        cluster.address,
        "--num-cpus",
        "0",
        "--resources",
        '{"cko_victim": 1}',
        "--object-store-memory",
        "100000000",
        "--disable-usage-stats",
        env=cluster.env,
    )
    assert started.returncode == 0, started.stderr[-1500:]
    st = run_cko("fleet", "status", "--fleet", cluster.address, "--no-probe", "--json", env=cluster.env)
    (victim,) = [n for n in st.json["nodes"] if n["alive"] and "cko_victim" in n["resources"]]
    plans = tmp_path / "plans.json"
    plans.write_text(
        json.dumps(
            {
                "plans": [
                    {
                        "command": ["sh", "-c", "sleep 120"],
                        "label": "victim",
                        "resources": {"cko_victim": 1},
                        "slots": 0,
                    }
                ]
            }
        )
    )
    store = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "cko_perf",
        "fleet",
        "run",
        "--fleet",
        cluster.address,
        "--plans",
        str(plans),
        "--json",
        "--store",
        str(store),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    try:
        deadline = time.monotonic() + 60
        mine: list = []
        while not mine:
            assert time.monotonic() < deadline and proc.poll() is None, "the container never started"
            mine = [
                c
                for c in _containers("org.cko.invocation")
                if c.labels.get("org.cko.store", "").startswith(str(cluster.scratch))
            ]
            time.sleep(0.2)
        inv_id = mine[0].labels["org.cko.invocation"]
        raylets = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and f"--node_id={victim['node_id']}".encode() in _cmdline(p)
        ]
        assert len(raylets) == 1, raylets
        os.kill(raylets[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    (doc,) = json.loads(out)["invocations"]
    assert doc["id"] == inv_id and doc["state"] == "abandoned" and doc["node"]["node_id"] == victim["node_id"]
    res = json.loads((store / "invocations" / inv_id / "result.json").read_text())
    assert res["state"] == "abandoned"
    assert (
        res["cleanup"]["container_removed"] is None and "watchdog" in res["cleanup"]["reason"]
    )  # unconfirmed
    deadline = time.monotonic() + 30
    while _containers(f"org.cko.invocation={inv_id}"):  # the node's watchdog, not the controller, removed it
        assert time.monotonic() < deadline, "the lost node's container is still there"
        time.sleep(0.25)
    _verify(store, cluster.env)


EXECUTOR_SCRIPT = """
import json, sys
from cko_perf.runner.fleet import cli_session
from cko_perf.runner.invocation import Plan
from cko_perf.runner.store import Store

with cli_session(sys.argv[1]) as fl:
    run = fl.executor()  # what --fleet hands run_measurement in place of invocation.execute
    plan = Plan(op="exec", command=["sh", "-c", "echo '{\\"n\\": 7}' > /cko/out/result.json"], label="drop-in")
    out = run(Store(sys.argv[2]), plan, keep_outputs=True)
    doc = {"id": out.id, "state": out.result.state, "read": out.read_json("result.json"),
           "probe": sorted(out.meta)}
    out.close()
    doc["closed"] = out.out_dir is None
    again = run(Store(sys.argv[2]), Plan(op="exec", command=["true"], label="second look"))
    doc["nodes"] = [out.where["node_id"], again.where["node_id"]]
    doc["pinned"] = run.pinned["node_id"]
print(json.dumps(doc))
"""


@pytest.mark.docker
@pytest.mark.slow
def test_executor_is_a_drop_in_for_execute_with_kept_outputs(cluster: Cluster, tmp_path: Path) -> None:
    store = tmp_path / "store"
    p = subprocess.run(
        [sys.executable, "-c", EXECUTOR_SCRIPT, cluster.address, str(store)],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["state"] == "succeeded" and doc["read"] == {"n": 7} and doc["closed"]
    assert "probe.json" in doc["probe"]  # the in-container probe's metadata came back with the outputs
    assert not (store / "scratch" / doc["id"]).exists()
    assert doc["nodes"] == [doc["pinned"]] * 2  # sticky: the second look went where the first ran
    _verify(store, cluster.env)


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "numpy-softmax"


# Correct, and an order of magnitude slower than NumPy: a verdict that other load on this machine
# (it is shared) cannot turn around.
PYTHON_LOOPS = """import math

import numpy as np


def softmax(x):
    out = np.empty_like(x)
    for i, row in enumerate(x.tolist()):
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = sum(e)
        out[i] = [v / s for v in e]
    return out
"""


def _small_workload(tmp: Path) -> Path:
    """The NumPy example on one small case, with a far slower candidate beside it."""
    work = tmp / "numpy-softmax"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "r256x1024", "params": {"rows": 256, "cols": 1024}}]
    req["exclude"] += ["slower"]
    req["plan"].update({"screen_pairs": 8, "baseline_samples": 4, "aa_pairs": 6, "warmup": 1})
    (work / "readiness.json").write_text(json.dumps(req))
    (work / "slower").mkdir()
    (work / "slower" / "kernel.py").write_text(PYTHON_LOOPS)
    (work / "baseline.json").write_text(json.dumps({"samples_per_case": 4, "aa_pairs": 6, "seed": 1}))
    (work / "variant.json").write_text(json.dumps({"path": "slower", "claim": "pure Python loops"}))
    (work / "screen.json").write_text(json.dumps({"stage": "screen", "seed": 11}))
    return work


def _record(store: Path, kind: str, rid: str) -> dict:
    return json.loads((store / kind / f"{rid}.json").read_text())


def _on_the_fleet(ran_on: dict, inv: dict, nodes: set[str], cluster: Cluster, store: Path) -> None:
    assert ran_on["backend"] == "fleet" and ran_on["fleet"] == cluster.address
    assert ran_on["node_id"] in nodes and ran_on["invocation"] == inv
    res = json.loads((store / "invocations" / inv["id"] / "result.json").read_text())
    assert res["state"] == "succeeded"
    # the node ran it in its scratch store, the controller's store holds the imported record
    req = json.loads((store / "invocations" / inv["id"] / "request.json").read_text())
    assert all(m["source"].startswith(str(cluster.scratch)) for m in req["mounts"])


@pytest.mark.docker
@pytest.mark.slow
def test_readiness_baseline_and_screen_run_on_the_fleet(cluster: Cluster, tmp_path: Path) -> None:
    work = _small_workload(tmp_path)
    store = tmp_path / "store"
    st = run_cko("fleet", "status", "--fleet", cluster.address, "--no-probe", "--json", env=cluster.env)
    nodes = {n["node_id"] for n in st.json["nodes"] if n["alive"]}
    fleet = ["--fleet", cluster.address, "--json"]
    # The controller needs no engine of its own: the nodes (started with cluster.env) have theirs.
    controller = cluster.env | {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}

    r = run_cko("readiness", "--request", str(work / "readiness.json"), *fleet, store=store, env=controller)
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    tid = r.json["target"]["id"]
    target = _record(store, "targets", tid)
    _on_the_fleet(target["ran_on"], target["smoke"], nodes, cluster, store)
    assert target["identity"]["host"]["host_id"] == target["ran_on"]["host_id"]

    b = run_cko(
        "baseline",
        "--request",
        str(work / "baseline.json"),
        "--target",
        tid,
        *fleet,
        store=store,
        env=controller,
    )
    assert b.code == 0, b.stdout[-2000:] + b.stderr[-2000:]
    bas = _record(store, "baselines", b.json["baseline"]["id"])
    _on_the_fleet(bas["ran_on"], bas["invocation"], nodes, cluster, store)
    assert len(bas["cases"][0]["samples"]) == 4 and bas["identity_mismatch"] == []

    v = run_cko("variant", "--request", str(work / "variant.json"), "--target", tid, "--json", store=store)
    assert v.code == 0, v.stdout
    vid = v.json["variant"]["id"]

    screen = ["experiment", "--request", str(work / "screen.json"), "--target", tid, "--variant", vid]
    e = run_cko(*screen, *fleet, store=store, env=controller, timeout=300)
    assert e.code == 0, e.stdout[-2000:] + e.stderr[-2000:]
    exp = _record(store, "experiments", e.json["experiment"]["id"])
    (ran_on,) = exp["ran_on"]  # one look: one invocation, every pair of it on one node
    _on_the_fleet(ran_on, exp["invocation"], nodes, cluster, store)
    assert e.json["ran_on"] == exp["ran_on"]
    case = exp["cases"][0]  # the plan's 8 screen pairs, less any a pre-declared rule excluded (counted)
    assert exp["identity_mismatch"] == [] and case["pairs"] + case["excluded_pairs"] == 8, case

    # The same screen on this host: the same kind of verdict, and the record says it ran locally.
    local = run_cko(*screen, "--json", store=store, env=cluster.env, timeout=300)
    assert local.code == 0, local.stdout[-2000:]
    assert local.json["ran_on"][0]["backend"] == "local" and local.json["ran_on"][0]["node_id"] is None
    for doc in (e.json, local.json):
        assert doc["cases"][0]["case_verdict"] == "regressed", doc  # the pairs say so, wherever they ran
        # Load above the plan's ceiling voids a screen the same way wherever it ran.
        expected = ("void", "void") if doc["stage_outcome"] == "void" else ("rejected", "regressed")
        assert (doc["stage_outcome"], doc["primary_verdict"]) == expected, doc

    assert not [
        c
        for c in _containers("org.cko.invocation")
        if c.labels.get("org.cko.store", "").startswith(str(cluster.scratch))
    ]
    v = _verify(store, cluster.env)
    assert v["checked"]["invocations"] == 4  # smoke, baseline, fleet screen, local screen


def _slower_is_never_faster(doc: dict) -> None:
    """Four screens on a small host load each other: the far slower candidate is `regressed`, or, where
    the neighbours' load voided pairs or crossed the ceiling, `inconclusive` saying so; never better."""
    verdict = doc["cases"][0]["case_verdict"]
    assert verdict in ("regressed", "inconclusive") and doc["stage_outcome"] != "accepted", doc
    if verdict == "inconclusive":
        named = [c for c in doc["reason_codes"] if c.startswith(("load_", "pairs_excluded"))]
        assert named, doc  # an inconclusive screen under load names the load


@pytest.mark.docker
@pytest.mark.slow
def test_four_screens_at_once_on_four_slots(cluster: Cluster, tmp_path: Path) -> None:
    """Four `cko experiment --fleet` screens started together against one store: Ray places them on the
    four slots of the two nodes (the CPU example's stand-in for four GPUs), all four measure at once, and
    the one store takes all four records intact."""
    work = _small_workload(tmp_path)
    store = tmp_path / "store"
    fleet = ["--fleet", cluster.address, "--json"]
    r = run_cko("readiness", "--request", str(work / "readiness.json"), *fleet, store=store, env=cluster.env)
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    tid = r.json["target"]["id"]
    v = run_cko("variant", "--request", str(work / "variant.json"), "--target", tid, "--json", store=store)
    vid = v.json["variant"]["id"]
    procs = []
    for seed in range(4):
        req = tmp_path / f"screen-{seed}.json"
        req.write_text(json.dumps({"stage": "screen", "seed": 20 + seed}))
        cmd = [
            *CKO,
            "experiment",
            "--request",
            str(req),
            "--target",
            tid,
            "--variant",
            vid,
            *fleet,
            "--store",
            str(store),
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=os.environ | {"PYTHONPATH": str(ROOT)} | cluster.env,
            )
        )
    docs = []
    for proc in procs:
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        docs.append(json.loads(out))
    windows, nodes = [], set()
    for doc in docs:
        exp = _record(store, "experiments", doc["experiment"]["id"])
        (ran_on,) = exp["ran_on"]
        nodes.add(ran_on["node_id"])
        res = json.loads((store / "invocations" / exp["invocation"]["id"] / "result.json").read_text())
        windows.append((_ts(res["started_at"]), _ts(res["ended_at"])))
        _slower_is_never_faster(doc)
    assert _max_overlap(windows) == 4, windows
    assert len(nodes) == 2  # two slots per node: both nodes measured
    v = _verify(store, cluster.env)
    assert v["checked"]["invocations"] == 5  # the smoke and four screens


@pytest.mark.docker
@pytest.mark.slow
def test_readiness_on_the_fleet_names_what_no_node_has(cluster: Cluster, tmp_path: Path) -> None:
    work = _small_workload(tmp_path)
    req = json.loads((work / "readiness.json").read_text())
    req.update({"gpu": {"required": True, "count": 1}, "device": "cuda"})
    (work / "readiness.json").write_text(json.dumps(req))
    store = tmp_path / "store"
    r = run_cko(
        "readiness",
        "--request",
        str(work / "readiness.json"),
        "--fleet",
        cluster.address,
        "--gpu-model",
        "FAKE",
        "--json",
        store=store,
        env=cluster.env,
    )
    assert r.code == 1 and r.json["ready"] is False, r.stdout[-2000:]
    (b,) = r.json["blockers"]
    assert b["what"] == "fleet" and "GPU 0 of 1" in b["reason"]  # gpu:FAKE is there, Ray's GPU is not
    assert not list((store / "targets").glob("*.json")) and not list((store / "invocations").glob("*"))
    r = run_cko(
        "readiness", "--request", str(work / "readiness.json"), "--gpu-model", "FAKE", "--json", store=store
    )
    assert r.code == 2 and r.json["field"] == "gpu_model"


TRACE = ROOT / "tests" / "fixtures" / "torch" / "torch_trace.json"


@pytest.mark.docker
@pytest.mark.slow
def test_evidence_operations_run_on_the_fleet_through_the_executor(cluster: Cluster, tmp_path: Path) -> None:
    """An evidence command takes the measurements' path: its request becomes a Plan for the executor,
    and --fleet ships its inputs to a node. The controller has no engine: only a node can run it."""
    store = tmp_path / "store"
    controller = cluster.env | {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    p = run_cko(
        "profile", "torch", "--report", str(TRACE), "--fleet", cluster.address, "--json",
        store=store, env=controller, timeout=180,
    )  # fmt: skip
    assert p.code == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.json["op"] == "profile-torch" and p.json["facts"]["gpu_events"] == 36
    req = json.loads((store / "invocations" / p.json["invocation_id"] / "request.json").read_text())
    assert req["op"] == "profile-torch" and req["command"][4] == "profile-torch"
    (mount,) = req["mounts"]  # the staged report, shipped: mounted from the node's scratch
    assert mount["target"] == "/cko/in/trace.json" and mount["source"].startswith(str(cluster.scratch))
    # A refusal keeps its exit code and document wherever it ran.
    bad = tmp_path / "trace.json"
    bad.write_text('{"traceEvents": {}}')
    r = run_cko(
        "profile", "torch", "--report", str(bad), "--fleet", cluster.address, "--json",
        store=store, env=controller, timeout=180,
    )  # fmt: skip
    assert r.code == 1 and r.json["refused"] is True, r.stdout[-2000:] + r.stderr[-2000:]
    _verify(store, cluster.env)


def test_unreachable_fleet_fails_fast() -> None:
    pytest.importorskip("ray")
    t0 = time.monotonic()
    r = run_cko("fleet", "status", "--fleet", f"127.0.0.1:{_free_port()}", "--json")
    assert r.code == 5 and r.json["error"] == "fleet_unreachable"
    assert time.monotonic() - t0 < 30
    r = run_cko("exec", "--fleet", "not-an-address", "--json", "--", "true")
    assert r.code == 2 and r.json["field"] == "fleet"


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


# -- without a cluster ----------------------------------------------------------------------


def test_placement_resources() -> None:
    plan = Plan(op="exec", command=["true"], gpus=["0", "1"])
    p = placement_for(plan, gpu_model="H200")
    assert p.num_gpus == 2 and p.resource_request() == {"gpu:H200": 2.0}
    assert Placement().resource_request() == {"cko_slot": 1.0}
    assert Placement(resources={"gpu:FAKE": 1}).resource_request() == {"gpu:FAKE": 1.0, "cko_slot": 1.0}
    with pytest.raises(CkoError) as e:
        placement_for(Plan(op="exec", command=["true"], gpus=["all"]))
    assert e.value.field == "gpus"
    with pytest.raises(CkoError) as e:  # pinned devices need a pinned node and one UUID per GPU
        Placement(num_gpus=1, devices=["GPU-a"]).ray_options()
    assert e.value.field == "devices"


def test_plan_travels_as_data_and_shipped_inputs_are_verified(tmp_path: Path) -> None:
    src = tmp_path / "h"
    (src / "d").mkdir(parents=True)
    (src / "d" / "run.sh").write_text("echo hi\n")
    (src / "d" / "run.sh").chmod(0o755)
    (src / "empty").mkdir()
    f = tmp_path / "plan.json"
    f.write_text("{}")
    plan = Plan(
        op="measure",
        command=["x"],
        mounts=[
            Mount(str(src), "/cko/harness"),
            Mount(str(f), "/cko/p.json"),
            Mount("/node/path", "/cko/rw", read_only=False),
        ],
        parent={"target": {"id": "tgt-x"}},
    )
    wire, blobs = plan_to_wire(plan)
    assert WirePlan.model_validate(json.loads(wire.model_dump_json())) == wire  # plain data only
    assert [m.shipped is not None for m in wire.mounts] == [True, True, False]
    back = plan_from_wire(wire, blobs, tmp_path / "node")
    assert back.parent == plan.parent and back.command == plan.command
    h, p, rw = back.mounts
    assert (Path(h.source) / "d" / "run.sh").read_text() == "echo hi\n"
    assert os.access(Path(h.source) / "d" / "run.sh", os.X_OK) and (Path(h.source) / "empty").is_dir()
    assert Path(p.source).read_text() == "{}" and p.target == "/cko/p.json"
    assert (rw.source, rw.read_only) == ("/node/path", False)  # never shipped: must exist on the node
    altered = {k: b"tampered" for k in blobs}
    with pytest.raises(CkoError) as e:
        plan_from_wire(wire, altered, tmp_path / "node2")
    assert e.value.code == "ship_corrupt"


def _dev(device: str, verdict: str, effect: float, pool: dict | None = None) -> dict:
    return {
        "device": device,
        "verdict": verdict,
        "effect_pct": effect,
        "ci_low_pct": effect - 1,
        "ci_high_pct": effect + 1,
        "pool": pool or {"devices.name": ["NVIDIA H200"]},
    }


def test_combine_per_device_rules() -> None:
    c = combine_per_device([_dev("GPU-a", "accepted", 8.0), _dev("GPU-b", "accepted", 6.0)])
    assert c.verdict == "accepted" and c.agreement and c.effect_range_pct == [6.0, 8.0]
    assert [d.device for d in c.devices] == ["GPU-a", "GPU-b"]
    c = combine_per_device([_dev("GPU-a", "accepted", 8.0), _dev("GPU-b", "inconclusive", 2.0)])
    assert c.verdict == "inconclusive" and not c.agreement and c.reasons == ["GPU-b: inconclusive"]
    c = combine_per_device([_dev("GPU-a", "accepted", 8.0), _dev("GPU-b", "regressed", -3.0)])
    assert c.verdict == "regressed"
    c = combine_per_device([_dev("GPU-a", "below_minimum", 1.0), _dev("GPU-b", "accepted", 6.0)])
    assert c.verdict == "below_minimum"
    with pytest.raises(CkoError) as e:
        combine_per_device(
            [
                _dev("GPU-a", "accepted", 8.0),
                _dev("GPU-b", "accepted", 8.0, {"devices.name": ["NVIDIA A100"]}),
            ]
        )
    assert e.value.code == "mixed_identity_pool"
    with pytest.raises(CkoError):
        combine_per_device([_dev("GPU-a", "accepted", 8.0), _dev("GPU-a", "accepted", 8.0)])
    with pytest.raises(CkoError):
        combine_per_device([])


def test_analyse_device_uses_the_paired_statistics() -> None:
    ref = [10.0 + 0.01 * (i % 5) for i in range(30)]
    fast = [0.8 * x for x in ref]
    same = list(ref)
    a = analyse_device("GPU-a", ref, fast, direction="lower", min_effect_pct=5.0, resamples=500)
    b = analyse_device("GPU-b", ref, same, direction="lower", min_effect_pct=5.0, resamples=500)
    assert isinstance(a, DeviceAnalysis) and a.verdict == "accepted" and a.n_pairs == 30
    assert a.effect_pct is not None and 20 < a.effect_pct < 30
    assert b.verdict == "below_minimum"
    assert combine_per_device([a, b]).verdict == "below_minimum"


def test_combine_cli(tmp_path: Path) -> None:
    f = tmp_path / "devices.json"
    f.write_text(json.dumps([_dev("GPU-a", "accepted", 8.0), _dev("GPU-b", "accepted", 7.0)]))
    r = run_cko("fleet", "combine", "--results", str(f), "--json")
    assert r.code == 0 and r.json["verdict"] == "accepted" and len(r.json["devices"]) == 2
    f.write_text(json.dumps([{"device": "GPU-a"}]))
    r = run_cko("fleet", "combine", "--results", str(f), "--json")
    assert r.code == 2 and r.json["field"] == "results[0]"
