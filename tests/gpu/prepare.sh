#!/usr/bin/env bash
# On the lent GPU machine (root, the repository root as the working directory), after
# tests/gpu/make_carry.sh filled .carry here and the device call carried it:
#   1. unpacks .carry/docker.tar.xz to /opt/cko-docker (Debian's dockerd, containerd, runc, docker-init, CLI)
#   2. starts dockerd (which starts its own containerd) with --data-root /tmp/dkdata, no bridge and no
#      iptables rules (no container ever gets a network), in its own session (setsid), and waits for it
#   3. installs the carried wheels (pydantic stack, docker SDK) into /tmp/cko-site for the host's
#      python3 (/opt/torch/.venv/bin/python3 there: numpy, scipy, pyyaml, nvidia-ml-py, click, rich)
#   4. checks `python3 -m cko_perf doctor --json` (saved to /tmp/cko-doctor.json)
# Source it, so the exports stay (PATH, PYTHONPATH, CKO_WHEELHOUSE, CKO_PARSE_IMAGE):
#   source tests/gpu/prepare.sh
# `bash tests/gpu/prepare.sh` does the same and only reports. Idempotent: a second run reuses what is up.
# The carried libraries (libdevmapper, libsystemd ...) are given to dockerd alone (LD_LIBRARY_PATH in
# its environment, inherited by containerd, the shim and runc), never to the caller's shell, so the
# host's own programs (python3, torch) keep the host's libraries.

_cko_prepare() {
  local repo py dk data log t0 t tu td ts tdoc stamp want i
  repo=$(pwd)
  py=${CKO_PYTHON:-python3}
  dk=${CKO_DOCKER_DIR:-/opt/cko-docker}
  data=${CKO_DOCKER_DATA:-/tmp/dkdata}
  log=${CKO_DOCKERD_LOG:-/tmp/dockerd.log}
  _now() { date +%s.%N; }
  _dt() { awk -v a="$1" -v b="$(_now)" 'BEGIN { printf "%.1f", b - a }'; }
  t0=$(_now)
  if [ ! -f .carry/docker.tar.xz ] || ! ls .carry/wheels/*.whl >/dev/null 2>&1; then
    echo "prepare: .carry/docker.tar.xz or .carry/wheels missing: run tests/gpu/make_carry.sh here and carry .carry" >&2
    return 5
  fi

  # 1. the engine's binaries
  t=$(_now)
  want=$(stat -c '%s %Y' .carry/docker.tar.xz)
  stamp="$dk/.carried"
  if [ ! -x "$dk/bin/dockerd" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$dk" && mkdir -p "$dk" && tar -C "$dk" -xJf .carry/docker.tar.xz && echo "$want" > "$stamp" \
      || { echo "prepare: unpacking .carry/docker.tar.xz failed" >&2; return 5; }
  fi
  tu=$(_dt "$t")
  case ":$PATH:" in *":$dk/bin:"*) ;; *) export PATH="$dk/bin:$PATH" ;; esac

  # 2. dockerd (its managed containerd, runc and docker-init are found on PATH)
  t=$(_now)
  if ! docker info >/dev/null 2>&1; then
    mkdir -p "$data"
    env LD_LIBRARY_PATH="$dk/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      setsid dockerd --data-root "$data" --bridge=none --iptables=false --ip6tables=false \
      >"$log" 2>&1 </dev/null &
    for i in $(seq 1 150); do
      docker info >/dev/null 2>&1 && break
      sleep 0.2
    done
  fi
  td=$(_dt "$t")
  if ! docker info >/dev/null 2>&1; then
    echo "prepare: dockerd did not answer within 30 s; the end of $log:" >&2
    tail -n 25 "$log" >&2
    return 5
  fi

  # 3. cko's missing Python packages, for the host's interpreter
  t=$(_now)
  want=$(cd .carry/wheels && ls *.whl | sort | tr '\n' ' ')
  if [ "$(cat /tmp/cko-site/.carried 2>/dev/null)" != "$want" ]; then
    rm -rf /tmp/cko-site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/cko-site \
      .carry/wheels/*.whl && echo "$want" > /tmp/cko-site/.carried \
      || { echo "prepare: pip install of .carry/wheels into /tmp/cko-site failed" >&2; return 5; }
  fi
  ts=$(_dt "$t")
  export PYTHONPATH="/tmp/cko-site:$repo${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1
  # a `cko` command, as a wheel install gives one (the host's python with the checkout and carried packages)
  mkdir -p /tmp/cko-bin
  printf '#!/bin/sh\nexport PYTHONPATH="/tmp/cko-site:%s${PYTHONPATH:+:$PYTHONPATH}"\nexec %s -m cko_perf "$@"\n' \
    "$repo" "$(command -v "$py")" > /tmp/cko-bin/cko && chmod 755 /tmp/cko-bin/cko
  case ":$PATH:" in *":/tmp/cko-bin:"*) ;; *) export PATH="/tmp/cko-bin:$PATH" ;; esac
  # no package index there: image builds take the carried cp312 wheels (runner/images.py ensure_wheels)
  export CKO_WHEELHOUSE="$repo/.carry/wheels"
  # no cpu image there: parsers run in the cuda image (runner/operation.py)
  export CKO_PARSE_IMAGE=cuda
  # the lock of the images built on this machine: outside the tree, which every device call lays anew
  # (a lock in the tree would name images this machine never had, and the next call would rebuild)
  export CKO_IMAGES_LOCK=/tmp/cko-images.lock
  [ -s "$CKO_IMAGES_LOCK" ] || cp cko-images.lock "$CKO_IMAGES_LOCK"

  # 4. what cko sees
  t=$(_now)
  "$py" -m cko_perf doctor --json > /tmp/cko-doctor.json 2>/tmp/cko-doctor.err
  local rc=$?
  tdoc=$(_dt "$t")
  "$py" - /tmp/cko-doctor.json <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"prepare: doctor gave no JSON ({exc}); see /tmp/cko-doctor.err")
    raise SystemExit(0)
g, e = d.get("gpu") or {}, d.get("engine") or {}
devs = ", ".join(f"{x.get('name')} {x.get('uuid')}" for x in g.get("devices") or []) or "none"
usable = [m["mode"] for m in d.get("passthrough") or [] if m.get("usable")]
print(f"prepare: doctor: engine {e.get('version')} ({e.get('storage_driver')}, cgroup v{e.get('cgroup_version')}); "
      f"driver {g.get('driver_version')}; GPUs {devs}; passthrough usable {usable}; blockers {d.get('blockers')}")
EOF
  echo "prepare: unpack ${tu} s, dockerd ${td} s, cko site ${ts} s, doctor ${tdoc} s (rc $rc); total $(_dt "$t0") s"
  return 0
}
_cko_prepare
_cko_prepare_rc=$?
unset -f _cko_prepare _now _dt
# sourced: hand the status back; run as a script: exit with it
return $_cko_prepare_rc 2>/dev/null || exit $_cko_prepare_rc
