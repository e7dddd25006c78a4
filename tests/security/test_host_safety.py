"""Issue 20: no path from a workload or a request to the host.

Each test is a hostile workload or request run through the CLI against the real engine; the
defence is read back where it lives: `docker inspect` of the running container, the container's
own cgroup files, /proc/mounts on the host, the recorded request, `cko verify`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import CKO, ROOT, run_cko

pytestmark = pytest.mark.docker


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | {"PYTHONPATH": path} | extra


def _inv_dirs(store: Path) -> list[Path]:
    """Oldest first, by creation (ids made in the same second carry a random suffix, so not by name)."""
    if not (store / "invocations").exists():
        return []
    return sorted(
        (store / "invocations").iterdir(),
        key=lambda d: (
            (d / "request.json").stat().st_mtime_ns if (d / "request.json").exists() else d.stat().st_mtime_ns
        ),
    )


def _container_of(store: Path, timeout: float = 30) -> dict:
    import docker

    client = docker.from_env()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cs = client.containers.list(filters={"label": f"org.cko.store={store.absolute()}"})
        if cs:
            return client.api.inspect_container(cs[0].id)
        time.sleep(0.2)
    raise AssertionError("no running container for the store")


def _start(store: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*CKO, "exec", "--store", str(store), "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
        cwd=ROOT,
    )


# -- limits always set --------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "0b", "0g", "-5m"])
def test_zero_or_negative_memory_is_refused_never_unlimited(store: Path, value: str) -> None:
    r = run_cko("exec", "--json", "--memory", value, "--", "true", store=store)
    assert r.code == 2 and r.json["field"] == "memory", r.stdout
    assert _inv_dirs(store) == []


@pytest.mark.parametrize("flag,value", [("--cpus", "0"), ("--cpus", "-1"), ("--pids", "0"), ("--pids", "-3")])
def test_zero_cpus_or_pids_refused(store: Path, flag: str, value: str) -> None:
    r = run_cko("exec", "--json", flag, value, "--", "true", store=store)
    assert r.code == 2 and r.json["field"] == flag[2:], r.stdout


def test_memory_zero_in_a_readiness_request_is_refused(store: Path, tmp_path: Path) -> None:
    req = (
        json.loads((ROOT / "examples" / "cpu-reduce" / "readiness.json").read_text())
        if (ROOT / "examples" / "cpu-reduce" / "readiness.json").exists()
        else {"name": "x", "reports": ["r"], "mode": "diagnostic"}
    )
    req["memory"] = "0"
    f = tmp_path / "req.json"
    f.write_text(json.dumps(req))
    r = run_cko("readiness", "--request", str(f), "--json", store=store)
    assert r.code == 2 and "memory" in (r.json.get("field") or ""), r.stdout


def test_every_limit_is_set_on_the_running_container(store: Path) -> None:
    """docker inspect while it runs: memory, CPU, pids, /tmp, no log, no capability, cko's init."""
    p = _start(store, "--timeout", "60", "--", "sh", "-c", "sleep 3")
    try:
        hc = _container_of(store)
        host, cfg = hc["HostConfig"], hc["Config"]
        assert host["Memory"] == 4 << 30 and host["MemorySwap"] == 4 << 30
        assert host["NanoCpus"] == int(max(1, (os.cpu_count() or 1) - 1) * 1e9)  # a default CPU limit, always
        assert host["PidsLimit"] == 1024
        assert "size=1073741824" in host["Tmpfs"]["/tmp"]
        assert host["LogConfig"]["Type"] == "none"  # the engine keeps no log on the host's disk
        assert not host.get("CapAdd") and host["CapDrop"] == ["ALL"] and host["Privileged"] is False
        assert (
            "no-new-privileges" in host["SecurityOpt"]
            and host["ReadonlyRootfs"]
            and host["NetworkMode"] == "none"
        )
        assert host.get("Init") in (None, False) and cfg["Entrypoint"][3].endswith("operations/init.py")
        assert float(cfg["Labels"]["org.cko.deadline"]) > time.time()
        out = next(m for m in hc["Mounts"] if m["Destination"] == "/cko/out")
        mounts = Path("/proc/mounts").read_text().split("\n")
        assert any(f" {out['Source']} tmpfs " in ln and "size=1048576k" in ln for ln in mounts), out
        assert all(m["Source"].startswith(str(store.absolute())) for m in hc["Mounts"])  # only cko's paths
    finally:
        assert p.wait(60) == 0


def test_policy_max_cpus_applies_without_the_flag(store: Path, tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("max_cpus: 0.5\n")
    r = run_cko(
        "exec",
        "--json",
        "--policy",
        str(pol),
        "--",
        "cat",
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        store=store,
    )
    assert r.code == 0 and r.json["stdout_tail"].strip() == "50000"
    r = run_cko("exec", "--json", "--policy", str(pol), "--cpus", "2", "--", "true", store=store)
    assert r.code == 3 and r.json["field"] == "max_cpus"


def test_fork_bomb_is_bounded(store: Path) -> None:
    t0 = time.monotonic()
    r = run_cko(
        "exec",
        "--json",
        "--pids",
        "64",
        "--timeout",
        "6",
        "--",
        "sh",
        "-c",
        "b() { b | b & }; b; sleep 30",
        store=store,
    )
    assert r.code in (1, 4), r.stdout
    assert r.json["cleanup"]["container_removed"] is True and time.monotonic() - t0 < 60


# -- bounded logs and outputs -------------------------------------------------------------


def test_log_flood_never_reaches_the_host_disk(store: Path) -> None:
    r = run_cko("exec", "--json", "--", "sh", "-c", "head -c 200000000 /dev/zero | tr '\\0' x", store=store)
    assert r.code == 0
    assert r.json["stdout_bytes"] >= 200_000_000 and r.json["stdout"]["size"] < 300_000


def _policy(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return p


def test_out_flood_bounded_in_bytes(store: Path, tmp_path: Path) -> None:
    pol = _policy(tmp_path, "default_output: 8m\n")
    r = run_cko(
        "exec",
        "--json",
        "--policy",
        str(pol),
        "--memory",
        "256m",
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/cko/out/big bs=1M count=3000 2>&1 | tail -1; true",
        store=store,
    )
    assert r.code == 0, r.stdout
    assert "8.0 MiB" in r.json["stdout_tail"]  # dd stopped at the bound (ENOSPC), not at 3000 MiB
    assert "output area full" in r.json["reason"]
    assert sum(o["size"] for o in r.json["outputs"]) <= 8 << 20
    assert not (store / "scratch").exists() or not any((store / "scratch").iterdir())  # unmounted, removed


def test_out_flood_bounded_in_files(store: Path, tmp_path: Path) -> None:
    pol = _policy(tmp_path, "default_output_files: 100\n")
    r = run_cko(
        "exec",
        "--json",
        "--policy",
        str(pol),
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 1000 ]; do echo > /cko/out/f$i 2>/dev/null || break; i=$((i+1)); done; echo $i",
        store=store,
    )
    assert r.code == 0, r.stdout
    assert int(r.json["stdout_tail"].strip()) < 130 and len(r.json["outputs"]) <= 100
    assert "output area full" in r.json["reason"]


def test_3000_deep_tree_does_not_crash_this_or_the_next_command(store: Path) -> None:
    code = "import os\nos.chdir('/cko/out')\nfor i in range(3000):\n    os.mkdir('d'); os.chdir('d')\nopen('f','w').write('x')\n"
    r = run_cko("exec", "--json", "--", "python3", "-c", code, store=store)
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "deeper than 64 levels" in r.json["reason"]
    assert run_cko("exec", "--json", "--", "true", store=store).code == 0
    assert run_cko("verify", "--json", store=store).json["ok"] is True


# -- paths, once ----------------------------------------------------------------------------


class _Swapper:
    """`allowed/d` flips between a real directory and a symbolic link to `secret`, as fast as it can."""

    def __init__(self, tmp_path: Path) -> None:
        self.allowed, self.secret = tmp_path / "allowed", tmp_path / "secret"
        (self.allowed / "d").mkdir(parents=True)
        (self.allowed / "d" / "f").write_text("benign\n")
        self.secret.mkdir()
        (self.secret / "f").write_text("SECRET\n")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._swap, daemon=True)

    def _swap(self) -> None:
        link, real, d = self.allowed / "link", self.allowed / "real", self.allowed / "d"
        d.rename(real)
        while not self.stop.is_set():
            link.symlink_to(self.secret)
            os.replace(link, d)  # d is now a link out of the roots
            os.unlink(d)
            real.rename(d)  # d is a directory again
            d.rename(real)

    def __enter__(self) -> _Swapper:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


def test_symlink_swap_race_in_the_resolver_only_refuses(tmp_path: Path) -> None:
    """Thousands of resolutions under the race: each ends in the directory inside the roots or in a
    refusal with an exit code, never in the secret nor in an uncaught error (realpath itself races)."""
    from cko_perf.runner import hostpath
    from cko_perf.runner.errors import CkoError
    from cko_perf.runner.policy import Policy

    sw = _Swapper(tmp_path)
    benign = (sw.allowed / "d").stat().st_ino
    policy = Policy(mount_roots=[str(sw.allowed)])
    seen: dict[str, int] = {}
    with sw:
        # many rounds: realpath's own race (a link gone between its lstat and readlink) is ~1 in 300
        for _ in range(20_000):
            try:
                with hostpath.resolve(str(sw.allowed / "d"), "mount") as op:
                    hostpath.check_roots(policy, op, "d", "mount")
                    assert os.fstat(op.fd).st_ino == benign, op.real  # the very inode held
                    key = "admitted"
            except CkoError as e:
                assert e.exit_code in (2, 3), e.message
                key = e.code
            seen[key] = seen.get(key, 0) + 1
            time.sleep(0)  # let the swapper run: the GIL otherwise keeps one state for long stretches
    assert "admitted" in seen and "refused_by_policy" in seen, seen


def test_symlink_swap_race_never_escapes_mount_roots(store: Path, tmp_path: Path) -> None:
    sw = _Swapper(tmp_path)
    pol = _policy(tmp_path, f"mount_roots: [{sw.allowed}]\n")
    runs = []
    with sw:
        for _ in range(15):
            r = run_cko(
                "exec",
                "--json",
                "--policy",
                str(pol),
                "--mount",
                f"{sw.allowed}/d:/data",
                "--",
                "sh",
                "-c",
                "cat /data/f",
                store=store,
            )
            assert "SECRET" not in r.stdout, r.stdout
            runs.append((r.code, r.stderr[-400:]))
    assert {c for c, _ in runs} <= {0, 2, 3}, runs


@pytest.mark.parametrize("kind", ["hardlink", "fifo", "proc", "socket"])
def test_special_paths_are_refused(store: Path, tmp_path: Path, kind: str) -> None:
    d = tmp_path / "w"
    d.mkdir()
    if kind == "hardlink":
        (tmp_path / "orig").write_text("x")
        os.link(tmp_path / "orig", d / "h")
        src = str(d)
    elif kind == "fifo":
        os.mkfifo(d / "pipe")
        src = str(d)
    elif kind == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(d / "sock"))
        src = str(d)
    else:
        src = f"/proc/{os.getpid()}/root/etc"
    t0 = time.monotonic()
    r = run_cko("exec", "--json", "--mount", f"{src}:/data", "--", "true", store=store)
    assert r.code == 3, r.stdout
    assert time.monotonic() - t0 < 60  # a FIFO never hangs the controller


def test_fifo_or_proc_as_a_report_is_refused(store: Path, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "trace.json")
    for path in (tmp_path / "trace.json", Path(f"/proc/{os.getpid()}/environ")):
        r = run_cko("profile", "torch", "--report", str(path), "--json", store=store, timeout=60)
        assert r.code in (2, 3), r.stdout


def test_workload_snapshot_refuses_links_out(store: Path, tmp_path: Path) -> None:
    from cko_perf.runner.errors import CkoError
    from cko_perf.runner.store import Store
    from cko_perf.runner.workflow.snapshot import take

    w = tmp_path / "w"
    w.mkdir()
    (w / "k.py").write_text("x = 1\n")
    (w / "leak").symlink_to("/etc/hostname")
    with pytest.raises(CkoError) as e:
        take(Store(store), w, [])
    assert e.value.exit_code == 2 and "symbolic link" in e.value.message


# -- the init: deadline, ptrace --------------------------------------------------------------


def test_workload_cannot_ptrace_its_init(store: Path) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('attach', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"
        "try:\n    open('/proc/1/mem','rb').read(1); print('mem readable')\nexcept OSError as e:\n    print('mem', e.errno)\n"
    )
    r = run_cko("exec", "--json", "--", "python3", "-c", code, store=store)
    assert r.code == 0
    assert "attach -1 1" in r.json["stdout_tail"]  # EPERM
    assert "mem 13" in r.json["stdout_tail"]


def test_killed_controller_container_still_ends_at_its_deadline(store: Path) -> None:
    import docker

    p = _start(store, "--timeout", "3", "--", "sh", "-c", "trap '' TERM; sleep 1000")
    hc = _container_of(store)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    c = docker.from_env().containers.get(hc["Id"])
    deadline = float(hc["Config"]["Labels"]["org.cko.deadline"])
    status = "running"
    while time.time() < deadline + 8:
        try:
            c.reload()
            status = c.status
        except docker.errors.NotFound:  # any cko on this engine reaps expired containers (reap_expired)
            status = "removed"
        if status != "running":
            break
        time.sleep(0.5)
    assert status != "running", "the container outlived its deadline with no controller"
    r = run_cko("reap", "--json", store=store)
    assert r.code == 0
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(hc["Id"])


# -- policy ----------------------------------------------------------------------------------


def test_system_policy_always_applies_and_caller_only_narrows(store: Path, tmp_path: Path) -> None:
    sysdir = tmp_path / "etc"
    sysdir.mkdir(mode=0o755)
    sp = sysdir / "policy.yaml"
    sp.write_text("max_memory: 1g\n")
    sp.chmod(0o644)
    env = {"CKO_SYSTEM_POLICY": str(sp)}
    caller = _policy(tmp_path, "max_memory: 8g\n")
    r = run_cko(
        "exec", "--json", "--policy", str(caller), "--memory", "2g", "--", "true", store=store, env=env
    )
    assert r.code == 3 and r.json["field"] == "max_memory"
    r = run_cko("exec", "--json", "--", "true", store=store, env=env)  # no --policy: still applies
    assert r.code == 0
    req = json.loads((_inv_dirs(store)[-1] / "request.json").read_text())
    assert req["system_policy_path"] == str(sp) and req["limits"]["memory_bytes"] == 1 << 30
    d = run_cko("doctor", "--json", env=env)
    assert d.json["policy"]["system_policy"] == str(sp)
    sp.chmod(0o666)
    r = run_cko("exec", "--json", "--", "true", store=store, env=env)
    assert r.code == 5 and r.json["error"] == "system_policy_untrusted"


def test_profiler_counter_capability_is_gone(store: Path, tmp_path: Path) -> None:
    pol = _policy(tmp_path, "allow_profiler_counters: true\n")
    r = run_cko("exec", "--json", "--policy", str(pol), "--", "true", store=store)
    assert r.code == 2 and r.json["field"] == "policy.allow_profiler_counters"


# -- locks -------------------------------------------------------------------------------------


def test_planted_lock_symlink_is_refused_and_target_untouched(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (locks / "gpu-GPU-x.lock").symlink_to(victim)
    code = "from cko_perf.runner.locks import gpu_lock\nwith gpu_lock('GPU-x').hold(timeout=1, what='g'):\n    pass\n"
    r = subprocess.run(
        ["python3" if False else CKO[0], "-c", code],
        capture_output=True,
        text=True,
        env=_env(CKO_LOCK_DIR=str(locks)),
        cwd=ROOT,
    )
    assert r.returncode != 0 and "symbolic link" in r.stderr
    assert victim.read_text() == "precious\n"
    locks.chmod(0o777)
    r = subprocess.run(
        [CKO[0], "-c", code], capture_output=True, text=True, env=_env(CKO_LOCK_DIR=str(locks)), cwd=ROOT
    )
    assert r.returncode != 0 and "lock_dir_unsafe" in r.stderr or "private directory" in r.stderr


# -- records -----------------------------------------------------------------------------------


@pytest.fixture
def keyed(tmp_path: Path) -> dict[str, str]:
    k = tmp_path / "keys" / "ledger.key"
    k.parent.mkdir(mode=0o700)
    k.write_text(os.urandom(32).hex())
    k.chmod(0o600)
    return {"CKO_LEDGER_KEY_FILE": str(k)}


def _two_runs(store: Path, env: dict[str, str]) -> None:
    for _ in range(2):
        assert run_cko("exec", "--json", "--", "true", store=store, env=env).code == 0
    v = run_cko("verify", "--json", store=store, env=env)
    assert v.json["ok"] is True, v.json


def test_keyed_ledger_detects_a_forged_record(store: Path, keyed: dict[str, str]) -> None:
    _two_runs(store, keyed)
    lines = (store / "ledger.jsonl").read_bytes().splitlines()
    from cko_perf.runner.canonical import sha256_bytes

    forged = store / "experiments" / "exp-20260101T000000-abcdef12.json"
    forged.write_text('{"verdict": "accepted"}')
    entry = {
        "path": str(forged.relative_to(store)),
        "sha256": sha256_bytes(forged.read_bytes()),
        "prev": sha256_bytes(lines[-1]),
        "seq": len(lines) + 1,
        "mac": "0" * 64,
    }
    with open(store / "ledger.jsonl", "ab") as f:
        f.write(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    v = run_cko("verify", "--json", store=store, env=keyed)
    assert v.code == 1 and any("fails its key" in p["problem"] for p in v.json["problems"])


def test_keyed_ledger_detects_deleted_newest_and_reordered(store: Path, keyed: dict[str, str]) -> None:
    _two_runs(store, keyed)
    led = store / "ledger.jsonl"
    lines = led.read_bytes().splitlines(keepends=True)
    newest = json.loads(lines[-1])
    led.write_bytes(b"".join(lines[:-1]))
    shutil.rmtree((store / newest["path"]).parent)  # the newest invocation, gone with its line
    v = run_cko("verify", "--json", store=store, env=keyed)
    assert v.code == 1 and any("newest records were removed" in p["problem"] for p in v.json["problems"]), (
        v.json
    )
    led.write_bytes(lines[1] + lines[0] + b"".join(lines[2:]))
    v = run_cko("verify", "--json", store=store, env=keyed)
    assert v.code == 1


def test_edited_champion_pointer_fails_verify(store: Path) -> None:
    from cko_perf.runner.canonical import canonical_bytes, sha256_bytes
    from cko_perf.runner.store import Store

    st = Store(store)
    tgt = {"id": "tgt-20260101T000000-aaaaaaaa", "sha256": "a" * 64}
    var_a = {"id": "var-20260101T000000-aaaaaaaa", "sha256": "b" * 64}
    sel = {
        "kind": "cko/selection-v1",
        "id": "sel-20260101T000000-aaaaaaaa",
        "target": tgt,
        "action": "select",
        "experiment": None,
        "variant": var_a,
        "snapshot": "c" * 64,
        "previous_pointer_sha256": None,
        "created_at": "2026-01-01T00:00:00Z",
        "reason": "r",
    }
    data = canonical_bytes(sel)
    st.commit_file(store / "champion" / "selections" / f"{sel['id']}.json", data)
    ptr = {
        "kind": "cko/champion-v1",
        "target": tgt,
        "selection": {"id": sel["id"], "sha256": sha256_bytes(data)},
        "variant": var_a,
        "snapshot": "c" * 64,
    }
    st.swap_champion(None, canonical_bytes(ptr))
    ok = [
        p
        for p in run_cko("verify", "--json", store=store).json["problems"]
        if "current.json" in p["path"] and "selection" in p["problem"]
    ]
    assert ok == []  # (the fake target and variant records are missing: only the pointer check matters here)
    ptr["variant"] = {"id": "var-20260101T000000-bbbbbbbb", "sha256": "d" * 64}
    ptr["snapshot"] = "e" * 64
    (store / "champion" / "current.json").write_bytes(canonical_bytes(ptr))
    v = run_cko("verify", "--json", store=store)
    assert any(p["path"] == "champion/current.json" and "edited" in p["problem"] for p in v.json["problems"])


def test_repair_after_partial_writes_keeps_committed_records(store: Path) -> None:
    assert run_cko("exec", "--json", "--", "true", store=store).code == 0
    before = (store / "ledger.jsonl").read_bytes()
    with open(store / "ledger.jsonl", "ab") as f:
        f.write(b'{"path":"targets/tgt-2026')  # a cut append
    (store / "targets" / "tgt-20260101T000000-aaaaaaaa.json").write_text("{}")  # written, never ledgered
    (store / "objects" / "sha256" / ".tmp-xyz").write_bytes(b"half")
    assert run_cko("verify", "--json", store=store).code == 1
    r = run_cko("repair", "--json", store=store)
    assert r.code == 0, r.json
    assert (store / "ledger.jsonl").read_bytes() == before
    assert run_cko("verify", "--json", store=store).json["ok"] is True


def test_disk_full_leaves_a_repairable_store(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        store = mnt / "store"
        assert run_cko("exec", "--json", "--", "true", store=store).code == 0
        filler = mnt / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=100000"], capture_output=True)
        r = run_cko("exec", "--json", "--", "sh", "-c", "echo hello", store=store)
        assert r.code != 0
        led = (store / "ledger.jsonl").read_bytes()
        assert led.endswith(b"\n")  # no partial line, even on a full disk
        filler.unlink()
        rep = run_cko("repair", "--json", store=store)
        assert rep.code == 0, rep.stdout
        assert run_cko("verify", "--json", store=store).json["ok"] is True
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
