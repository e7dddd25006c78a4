"""The sandbox and the invocation lifecycle against the real Docker engine (issue 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CKO, ROOT, run_cko

pytestmark = pytest.mark.docker


def _inv_dirs(store: Path) -> list[Path]:
    return sorted((store / "invocations").iterdir()) if (store / "invocations").exists() else []


def test_exec_runs_hardened_and_records_everything(store: Path) -> None:
    script = (
        "set -u; id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        "(touch /etc/x 2>/dev/null && echo rootfs-writable) || echo rootfs-readonly; "
        "ls /sys/class/net; cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max; "
        "echo result > /cko/out/answer.txt; mkdir -p /cko/out/sub; echo 2 > /cko/out/sub/two.txt; "
        "ln -s /etc/passwd /cko/out/link"
    )
    r = run_cko("exec", "--json", "--pids", "256", "--", "sh", "-c", script, store=store)
    assert r.code == 0, r.stderr
    doc = r.json
    assert doc["state"] == "succeeded" and doc["exit_code"] == 0
    out = doc["stdout_tail"].split()
    assert out[0] == "65534"  # non-root by default
    assert "CapEff:" in out and out[out.index("CapEff:") + 1] == "0000000000000000"
    assert out[out.index("NoNewPrivs:") + 1] == "1"
    assert "rootfs-readonly" in out
    assert "lo" in out and "eth0" not in out  # --network none: loopback only
    assert "256" in out
    names = sorted(o["name"] for o in doc["outputs"])
    assert names == ["answer.txt", "sub/two.txt"]  # the symlink was not followed or stored
    assert "not a regular file" in (doc["reason"] or "")
    ans = next(o for o in doc["outputs"] if o["name"] == "answer.txt")
    blob = store / "objects" / "sha256" / ans["sha256"][:2] / ans["sha256"]
    assert blob.read_text() == "result\n"
    assert doc["cleanup"]["container_removed"] is True
    assert doc["identity"]["image"]["id"].startswith("sha256:")
    assert doc["identity"]["engine"]["version"]
    assert doc["probe"]["tools"]["python"].startswith("3.")
    d = _inv_dirs(store)[0]
    events = [json.loads(x)["event"] for x in (d / "events.jsonl").read_text().splitlines()]
    assert events[:3] == ["created", "locks_acquired", "container_started"]
    assert events[-3:] == ["removed", "collected", "terminal"]
    assert run_cko("verify", "--json", store=store).json["ok"] is True


def test_failing_command_exit_1_and_output_truncated(store: Path) -> None:
    r = run_cko(
        "exec",
        "--json",
        "--",
        "sh",
        "-c",
        "head -c 3000000 /dev/zero | tr '\\0' x; echo; exit 7",
        store=store,
    )
    assert r.code == 1
    doc = r.json
    assert doc["state"] == "failed" and doc["container_exit_code"] == 7
    assert doc["stdout_bytes"] >= 3_000_000
    assert doc["stdout"]["size"] < 600_000  # head and tail kept, the middle cut and counted


def test_timeout_kills_a_workload_that_ignores_sigterm(store: Path) -> None:
    t0 = time.monotonic()
    r = run_cko(
        "exec",
        "--json",
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        "trap '' TERM; while true; do sleep 1; done",
        store=store,
    )
    elapsed = time.monotonic() - t0
    assert r.code == 4
    doc = r.json
    assert doc["state"] == "timed_out"
    assert doc["cleanup"]["container_removed"] is True
    assert elapsed < 2 + 5 + 30  # timeout + stop grace + cleanup bound
    import docker

    left = docker.from_env().containers.list(all=True, filters={"label": f"org.cko.invocation={doc['id']}"})
    assert left == []


def test_memory_limit_is_enforced(store: Path) -> None:
    r = run_cko(
        "exec",
        "--json",
        "--memory",
        "64m",
        "--",
        "python3",
        "-c",
        "x = bytearray(512 * 1024 * 1024)",
        store=store,
    )
    assert r.code == 1
    assert r.json["state"] == "failed"


def _start_exec(store: Path, seconds: int) -> tuple[subprocess.Popen[str], str]:
    """`cko exec -- sleep N` in the background; returns once its container has started."""
    proc = subprocess.Popen(
        [*CKO, "exec", "--store", str(store), "--json", "--", "sleep", str(seconds)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 60  # a loaded CI host can take seconds to start a container
    while time.monotonic() < deadline and proc.poll() is None:
        dirs = _inv_dirs(store)
        # the invocation's directory appears before its events.jsonl does
        events = dirs[0] / "events.jsonl" if dirs else None
        if events is not None and events.is_file() and "container_started" in events.read_text():
            return proc, dirs[0].name
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"invocation did not start (cko exec exit code {proc.poll()})")


def test_cancel_records_cancelled(store: Path) -> None:
    proc, inv = _start_exec(store, 60)
    st = run_cko("status", inv, "--json", store=store)
    assert st.json["state"] == "running"
    c = run_cko("cancel", inv, "--json", store=store)
    assert c.code == 0, c.stderr
    assert c.json["state"] == "cancelled"
    out, _ = proc.communicate(timeout=30)
    assert json.loads(out)["state"] == "cancelled"


def test_controller_killed_leaves_an_orphan_that_the_next_command_reaps(store: Path) -> None:
    proc, inv = _start_exec(store, 120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    import docker

    client = docker.from_env()
    assert client.containers.list(filters={"label": f"org.cko.invocation={inv}"})  # the orphan is there
    st = run_cko("status", inv, "--json", store=store)
    assert st.json["state"] == "abandoned"
    assert client.containers.list(all=True, filters={"label": f"org.cko.invocation={inv}"}) == []
    assert run_cko("verify", "--json", store=store).json["ok"] is True


def test_request_json_is_only_written_under_the_active_lock(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reap running in another command takes a request whose lock is free for an abandoned run.

    So the controller must hold the lock before request.json appears, on the run path and the
    refusal path alike (the CI run of 2026-12-03 caught the window between the two in a test)."""
    from cko_perf.runner import invocation
    from cko_perf.runner.errors import refused
    from cko_perf.runner.store import Store

    st = Store(store)
    held_at_write: list[bool] = []
    write_new = invocation.write_new

    def watched(path: Path, data: bytes) -> None:
        if path.name == "request.json":
            held_at_write.append(invocation.active_lock(st, path.parent.name).is_held())
        write_new(path, data)

    monkeypatch.setattr(invocation, "write_new", watched)
    done = invocation.execute(st, invocation.Plan(op="exec", command=["true"], timeout_s=60))
    assert done.result.state == "succeeded"
    res = invocation.refuse(
        st, invocation.Plan(op="exec", command=["true"]), refused("not here", "mount_roots")
    )
    assert res.state == "refused"
    assert held_at_write == [True, True]
    # and once the controllers are gone, the next reap finds nothing to take
    assert invocation.reap_orphans(st) == []


def test_policy_refusals_are_recorded_exit_3(store: Path, tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    pol = tmp_path / "policy.yaml"
    pol.write_text(f"mount_roots: [{allowed}]\nmax_timeout_s: 60\nmax_memory: 8g\n")
    r = run_cko(
        "exec",
        "--json",
        "--timeout",
        "30",
        "--policy",
        str(pol),
        "--mount",
        f"{other}:/data",
        "--",
        "true",
        store=store,
    )
    assert r.code == 3 and r.json["field"] == "mount_roots"
    r = run_cko("exec", "--json", "--policy", str(pol), "--timeout", "3600", "--", "true", store=store)
    assert r.code == 3 and r.json["field"] == "max_timeout_s"
    r = run_cko(
        "exec",
        "--json",
        "--timeout",
        "30",
        "--policy",
        str(pol),
        "--memory",
        "16g",
        "--",
        "true",
        store=store,
    )
    assert r.code == 3 and r.json["field"] == "max_memory"
    # a symlink inside the allowed root that escapes it is resolved and refused
    (allowed / "escape").symlink_to(other)
    r = run_cko(
        "exec",
        "--json",
        "--timeout",
        "30",
        "--policy",
        str(pol),
        "--mount",
        f"{allowed}/escape:/data",
        "--",
        "true",
        store=store,
    )
    assert r.code == 3 and r.json["field"] == "mount_roots"
    r = run_cko(
        "exec",
        "--json",
        "--timeout",
        "30",
        "--policy",
        str(pol),
        "--mount",
        f"{allowed}/../other:/data",
        "--",
        "true",
        store=store,
    )
    assert r.code == 3
    states = [json.loads((d / "result.json").read_text())["state"] for d in _inv_dirs(store)]
    assert states == ["refused"] * 5
    r = run_cko(
        "exec",
        "--json",
        "--timeout",
        "30",
        "--policy",
        str(pol),
        "--mount",
        f"{allowed}:/data",
        "--",
        "ls",
        "/data",
        store=store,
    )
    assert r.code == 0 and "escape" in r.json["stdout_tail"]


@pytest.mark.parametrize("src", ["/", "/proc", "/var/run/docker.sock", "/etc", "/sys/kernel"])
def test_dangerous_mounts_are_never_allowed(store: Path, src: str) -> None:
    if not Path(src).exists():
        pytest.skip(f"{src} absent here")
    r = run_cko("exec", "--json", "--mount", f"{src}:/host", "--", "true", store=store)
    assert r.code == 3, r.stdout
    assert r.json["field"] == "forbidden_mount"


@pytest.mark.parametrize(
    "args,field",
    [
        (["--timeout", "-5"], "timeout"),
        (["--timeout", "1e9"], "timeout"),
        (["--mount", "nocolon"], "mount"),
        (["--mount", "/tmp:relative"], "mount"),
        (["--memory", "lots"], "memory"),
    ],
)
def test_bad_input_exit_2_nothing_written(store: Path, args: list[str], field: str) -> None:
    r = run_cko("exec", "--json", *args, "--", "true", store=store)
    assert r.code == 2, (r.stdout, r.stderr)
    assert r.json["field"] == field
    assert _inv_dirs(store) == []


def test_store_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "notadir"
    f.write_text("x")
    r = run_cko("exec", "--json", "--", "true", store=f)
    assert r.code == 2 and r.json["field"] == "store"
    assert f.read_text() == "x"


def test_engine_down_exit_5(store: Path) -> None:
    r = run_cko(
        "exec", "--json", "--", "true", store=store, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    )
    assert r.code == 5 and r.json["error"] == "engine_unavailable"
    r = run_cko("doctor", "--json", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert r.code == 5 and r.json["engine"]["reachable"] is False


def test_two_invocations_on_one_gpu_lock_never_overlap(tmp_path: Path) -> None:
    """The per-GPU lock: the second holder waits (bounded) or times out; never both inside."""
    log = str(tmp_path / "log")
    code = (
        f"import sys, time, os; sys.path.insert(0, {str(ROOT)!r}); os.environ['CKO_LOCK_DIR'] = {str(tmp_path)!r}\n"
        "from cko_perf.runner.locks import gpu_lock\n"
        "with gpu_lock('GPU-test').hold(timeout=float(sys.argv[1]), what='GPU-test'):\n"
        f"    open({log!r}, 'a').write(f'in {{time.time()}}\\n'); time.sleep(1.5)\n"
        f"    open({log!r}, 'a').write(f'out {{time.time()}}\\n')\n"
    )
    a = subprocess.Popen([sys.executable, "-c", code, "10"])
    time.sleep(0.3)
    b = subprocess.Popen([sys.executable, "-c", code, "10"])
    c = subprocess.run([sys.executable, "-c", code, "0.2"], capture_output=True, text=True)
    assert a.wait() == 0 and b.wait() == 0
    assert c.returncode != 0 and "timed out" in c.stderr
    lines = [ln.split() for ln in (tmp_path / "log").read_text().splitlines()]
    assert [x[0] for x in lines] == ["in", "out", "in", "out"]


def test_verify_names_altered_and_missing_files(store: Path) -> None:
    r = run_cko("exec", "--json", "--", "sh", "-c", "echo hi > /cko/out/f.txt", store=store)
    assert r.code == 0
    doc = r.json
    blob = store / "objects" / "sha256" / doc["outputs"][0]["sha256"][:2] / doc["outputs"][0]["sha256"]
    blob.chmod(0o644)
    blob.write_text("tampered\n")
    req = _inv_dirs(store)[0] / "request.json"
    req.write_text(req.read_text().replace('"exec"', '"exex"'))
    v = run_cko("verify", "--json", store=store)
    assert v.code == 1
    problems = " ".join(p["path"] + " " + p["problem"] for p in v.json["problems"])
    assert "altered object" in problems and "request.json" in problems
    blob.unlink()
    v = run_cko("verify", "--json", store=store)
    assert any("missing" in p["problem"] for p in v.json["problems"])


def test_schema_lists_and_prints(store: Path) -> None:
    r = run_cko("schema", "--json")
    assert "invocation-result" in r.json["schemas"]
    for name in ("invocation-result", "policy", "target", "driver-request", "experiment-request"):
        s = run_cko("schema", name, "--json")
        assert s.code == 0 and s.json["type"] == "object", name
    assert run_cko("schema", "nope", "--json").code == 2
