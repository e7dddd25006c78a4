#!/usr/bin/env bash
# On the lent GPU machine (root, repository root, after `source tests/gpu/prepare.sh`): no registry
# can be reached there, so the cuda image's base is made from the host's own filesystem:
#   tar -c <selection> | docker import - cko/cuda-base:host
# and cko's cuda image is built on it with the host's torch interpreter:
#   python3 -m cko_perf images build cuda --base-image <id> \
#     --build-arg PYTHON=/opt/torch/.venv/bin/python3 --build-arg REQUIREMENTS=images/requirements-host.txt
# The selection: the userland (/bin /sbin /lib /lib64 /usr; under /usr the CUDA toolkit in
# /usr/local/cuda*), a minimal /etc, Nsight Compute (/opt/nvidia/nsight-compute), the interpreter's
# environment (/opt/torch) and, if it lies elsewhere, the interpreter's own installation. Left out:
# documentation, manuals, locales, firmware, kernel sources, Nsight Systems and the Java visual
# profiler (no operation runs them), JAX (no operation imports it), and the driver's user-space
# libraries and tools (/usr/local/nvidia, libcuda*, libnvidia-*, nvidia-smi): passthrough mode
# `devices` binds the host's read-only at run time, so an image never carries a driver version.
# Bytecode caches (__pycache__) are kept: the root is read-only at run time, so without them every
# container would compile torch's sources again at each import.
#
# Usage: bash tests/gpu/build_cuda_base.sh [--dry-run] [--base-only]
#   --dry-run    print the selection, the sizes of its parts and of what is left out, and the bytes
#                tar would stream; import and build nothing (works on any Linux host)
#   --base-only  import the base, build no cko image
# Environment: CKO_HOST_PYTHON (default /opt/torch/.venv/bin/python3, else python3), CKO_HOST_ENV
# (default /opt/torch where it exists, else the interpreter's sys.prefix), CKO_BASE_TAG
# (default cko/cuda-base:host), CKO_BASE_KEEP_JAX=1 to keep JAX, CKO_RUNNER_PYTHON (default python3).
# Writes /tmp/cko-base.txt (the figures) and /tmp/cko-cuda-build.json (the build's JSON).
set -u -o pipefail
DRY=0 BASE_ONLY=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --base-only) BASE_ONLY=1 ;;
    *) echo "usage: $0 [--dry-run] [--base-only]" >&2; exit 2 ;;
  esac
done
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "build_cuda_base: $*" | tee -a /tmp/cko-base.txt; }
: > /tmp/cko-base.txt

PY=${CKO_HOST_PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=$(command -v python3); fi
fi
RUNNER_PY=${CKO_RUNNER_PYTHON:-python3}
TAG=${CKO_BASE_TAG:-cko/cuda-base:host}
read -r PREFIX BASE_PREFIX PURELIB < <("$PY" -c \
  'import sys, sysconfig; print(sys.prefix, sys.base_prefix, sysconfig.get_paths()["purelib"])') \
  || { echo "build_cuda_base: cannot run $PY" >&2; exit 5; }
ENVDIR=${CKO_HOST_ENV:-}
if [ -z "$ENVDIR" ]; then
  if [ -d /opt/torch ]; then ENVDIR=/opt/torch; else ENVDIR=$PREFIX; fi
fi

case "$ENVDIR/ $PREFIX/ $BASE_PREFIX/" in
  /tmp/*|*" /tmp/"*) echo "build_cuda_base: $ENVDIR / $PREFIX / $BASE_PREFIX lies under /tmp, which a tmpfs hides in every container" >&2; exit 2 ;;
esac

# -- the selection (paths relative to /) --------------------------------------------------------
sel=()
for d in bin sbin lib lib64 usr; do [ -e "/$d" ] || [ -L "/$d" ] && sel+=("$d"); done
for f in passwd group nsswitch.conf ld.so.conf ld.so.conf.d ld.so.cache alternatives ssl ca-certificates \
         ca-certificates.conf os-release lsb-release debian_version mime.types; do
  [ -e "/etc/$f" ] || [ -L "/etc/$f" ] && sel+=("etc/$f")
done
[ -d /opt/nvidia/nsight-compute ] && sel+=("opt/nvidia/nsight-compute")
under_sel() {  # is absolute path $1 inside something already selected?
  local s
  for s in "${sel[@]}"; do case "${1#/}/" in "$s"/*) return 0 ;; esac; done
  return 1
}
under_sel "$ENVDIR" || sel+=("${ENVDIR#/}")
# a venv's interpreter lives elsewhere (its base prefix): bring that installation too
real_py=$(readlink -f "$PY")
for p in "$BASE_PREFIX" "$(dirname "$(dirname "$real_py")")"; do
  under_sel "$p" || sel+=("${p#/}")
done

# -- what is left out (GNU tar patterns, anchored at the member names, which carry no leading /) --
ex=(usr/share/doc usr/share/man usr/share/info usr/share/locale usr/share/i18n usr/share/lintian
    usr/lib/firmware usr/src
    usr/local/nvidia 'usr/local/cuda*/compat' 'usr/local/cuda*/libnvvp' 'usr/local/cuda*/nsight-systems*'
    'usr/lib/x86_64-linux-gnu/libcuda.so*' 'usr/lib/x86_64-linux-gnu/libnvidia-*'
    'usr/lib/x86_64-linux-gnu/lib*_nvidia.so*' 'usr/lib/x86_64-linux-gnu/nvidia' 'usr/bin/nvidia-*'
    'opt/nvidia/nsight-compute/*/docs')
sp=${PURELIB#/}
if [ "${CKO_BASE_KEEP_JAX:-0}" != 1 ]; then
  for j in jax jaxlib jax_plugins jax_cuda13_plugin jax_cuda13_pjrt jax_cuda12_plugin jax_cuda12_pjrt; do
    ex+=("$sp/$j" "$sp/$j-*.dist-info")
  done
fi
exargs=(--anchored --no-wildcards-match-slash)
for e in "${ex[@]}"; do exargs+=("--exclude=$e"); done

say "interpreter $PY (prefix $PREFIX, base $BASE_PREFIX, purelib $PURELIB)"
say "selection: ${sel[*]}"
say "left out: ${ex[*]}"

measure() {  # sizes of the parts, to see what the base holds and what slimming would gain
  local p
  echo "sizes (du -sh, MiB-rounded by du):"
  for p in "${sel[@]}"; do [ -d "/$p" ] && [ ! -L "/$p" ] && du -sh "/$p" 2>/dev/null; done
  for p in /usr/local/cuda* /usr/local/nvidia /usr/share/doc /usr/share/locale /usr/lib/firmware /usr/src; do
    [ -e "$p" ] && [ ! -L "$p" ] && du -sh "$p" 2>/dev/null
  done
  [ -d "$ENVDIR" ] && du -sh "$ENVDIR"/* "$ENVDIR"/.[!.]* 2>/dev/null
  echo "largest entries of $PURELIB:"
  du -s "$PURELIB"/* 2>/dev/null | sort -rn | head -n 15 | awk '{ printf "  %7.0f MiB  %s\n", $1 / 1024, $2 }'
}

if [ "$DRY" = 1 ]; then
  measure | tee -a /tmp/cko-base.txt
  t0=$(now)
  bytes=$(tar -C / -c "${exargs[@]}" -- "${sel[@]}" 2>/tmp/cko-base-tar.err | wc -c)
  say "dry run: tar would stream $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 2^30 }') GiB) in $(dt "$t0" "$(now)") s; tar warnings: $(wc -l < /tmp/cko-base-tar.err)"
  exit 0
fi

docker info >/dev/null 2>&1 || { echo "build_cuda_base: no Docker engine answers (source tests/gpu/prepare.sh first)" >&2; exit 5; }
measure > /tmp/cko-base-sizes.txt 2>&1 &
mpid=$!

# -- the base --------------------------------------------------------------------------------------
t0=$(now)
tar -C / -c --totals "${exargs[@]}" -- "${sel[@]}" 2>/tmp/cko-base-tar.err | docker import - "$TAG" >/tmp/cko-base.id
st=("${PIPESTATUS[@]}")
t1=$(now)
# tar exits 1 when a file changed while it was read (logs, caches): the base is still whole
if [ "${st[0]}" -gt 1 ] || [ "${st[1]}" -ne 0 ]; then
  echo "build_cuda_base: tar (exit ${st[0]}) | docker import (exit ${st[1]}) failed:" >&2
  grep -v 'socket ignored' /tmp/cko-base-tar.err | tail -n 10 >&2
  wait "$mpid"
  exit 5
fi
BASE=$(docker image inspect -f '{{.Id}}' "$TAG")
size=$(docker image inspect -f '{{.Size}}' "$TAG")
streamed=$(grep -o 'Total bytes written: [0-9]*' /tmp/cko-base-tar.err | grep -o '[0-9]*$')
wait "$mpid"
cat /tmp/cko-base-sizes.txt >> /tmp/cko-base.txt
say "base: $BASE $size bytes ($(awk -v b="$size" 'BEGIN { printf "%.2f", b / 2^30 }') GiB; tar streamed ${streamed:-?} bytes) in $(dt "$t0" "$t1") s"
[ "$BASE_ONLY" = 1 ] && exit 0

# -- cko's cuda image on it ------------------------------------------------------------------------
t2=$(now)
"$RUNNER_PY" -m cko_perf images build cuda --base-image "$BASE" --build-arg "PYTHON=$PY" \
  --build-arg REQUIREMENTS=images/requirements-host.txt --json > /tmp/cko-cuda-build.json
rc=$?
t3=$(now)
if [ $rc -ne 0 ]; then
  echo "build_cuda_base: cko images build cuda failed (exit $rc):" >&2
  head -c 3000 /tmp/cko-cuda-build.json >&2
  exit $rc
fi
say "cuda image: $("$RUNNER_PY" -c 'import json; e = json.load(open("/tmp/cko-cuda-build.json"))["built"][0]; print(e["image_id"], e["size_bytes"], "bytes")') in $(dt "$t2" "$t3") s"
