#!/usr/bin/env bash
# One device call that shows cko running on the lent H200 (tests/gpu/README.md):
#   bash tests/gpu/smoke.sh        (repo root, root, with .carry carried; run make_carry.sh here first)
# prepare.sh (dockerd from .carry, cko's Python env), doctor, build_cuda_base.sh (base from the host,
# cko's cuda image on it), then checks inside the hardened container through `cko exec`: the granted
# GPU alone is visible, the image's python finds torch and computes on the GPU, nvcc/ncu/cuobjdump
# answer, nvcc-built code runs (SASS, and PTX through the driver's JIT), a Triton kernel compiles and
# runs, ncu without the counters capability; and the start overhead. A failing step is recorded and the
# independent ones after it still run. Writes to $OUT (else ./smoke-out): smoke.log, summary.txt,
# doctor.json, base.txt, cuda-build.json, execs.tar.gz, dockerd.log.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/smoke-out}
mkdir -p "$OUT"
W=/tmp/cko-smoke
rm -rf "$W" && mkdir -p "$W/src" "$W/store"
exec > >(tee -a "$OUT/smoke.log") 2>&1
START=$(date +%s.%N)
now() { date +%s.%N; }
el() { awk -v a="$START" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
record() { printf '%-5s %-26s %7s s  %s\n' "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"; }  # verdict name seconds note
step() { echo; echo "=== [$(el) s] $*"; }
PY=${SMOKE_PYTHON:-python3}
CKO=("$PY" -m cko_perf)
G=${SMOKE_GPUS:-0}      # the GPU the checks are granted (index or UUID); none: a dry run on a host without one
BUDGET_S=${SMOKE_BUDGET_S:-470}   # optional steps are skipped past this many seconds
over_budget() { awk -v e="$(el)" -v b="$BUDGET_S" 'BEGIN { exit !(e > b) }'; }

finish() {
  step "files"
  cp /tmp/cko-doctor.json "$OUT/doctor.json" 2>/dev/null
  cp /tmp/cko-base.txt "$OUT/base.txt" 2>/dev/null
  cp /tmp/cko-cuda-build.json "$OUT/cuda-build.json" 2>/dev/null
  cp /tmp/dockerd.log "$OUT/dockerd.log" 2>/dev/null
  tar -C "$W" -czf "$OUT/execs.tar.gz" --exclude=store . 2>/dev/null
  echo; echo "=== summary (total $(el) s)"; cat "$SUMMARY"
}
trap finish EXIT

# -- the host as found -------------------------------------------------------------------------------
step "host"
date -u +%Y-%m-%dT%H:%M:%SZ; uname -r; nproc; free -g | head -2; df -h /tmp / | cat
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
HOST_UUIDS=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr -d ' ')
echo "python3: $(command -v python3) -> $(readlink -f "$(command -v python3)") ($(python3 -V 2>&1))"
ldconfig -p | grep -E 'libcuda\.so|libnvidia-(ml|ptxjitcompiler|nvvm|gpucomp)' | head -n 8
ls /usr/local/cuda*/bin/nvcc /opt/nvidia/nsight-compute/*/ncu 2>&1 | head -n 4

# -- 1. engine and cko's env ---------------------------------------------------------------------------
step "prepare"
t=$(now)
source tests/gpu/prepare.sh
rc=$?
[ $rc -eq 0 ] && v=PASS || v=FAIL
record $v prepare "$(dt "$t" "$(now)")" "$(grep -h '^prepare: unpack' "$OUT/smoke.log" | tail -n 1 | sed 's/^prepare: //')"

step "doctor"
t=$(now)
"${CKO[@]}" doctor --json > /tmp/cko-doctor.json
"$PY" - /tmp/cko-doctor.json "$HOST_UUIDS" <<'EOF' > "$W/doctor.check"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["gpu"]
devs = g.get("devices") or []
modes = {m["mode"]: m for m in d["passthrough"]}
ok = (g.get("available") and len(devs) >= 1 and devs[0]["uuid"] in sys.argv[2].split()
      and str(g.get("driver_version", "")).startswith("580") and modes["devices"]["usable"])
print("PASS" if ok else "FAIL", f"{[(x['name'], x['uuid'], x['compute_capability']) for x in devs]} driver "
      f"{g.get('driver_version')} cuda {g.get('cuda_driver_version')}; usable "
      f"{[m for m, c in modes.items() if c['usable']]}; nvidia: {modes['nvidia'].get('reason')}")
EOF
read -r v note < "$W/doctor.check" || { v=FAIL; note="no doctor JSON"; }
cat "$W/doctor.check"
record "$v" doctor "$(dt "$t" "$(now)")" "$note"

# -- 2. the base and the cuda image -----------------------------------------------------------------------
step "build_cuda_base"
t=$(now)
if "${CKO[@]}" images list --json 2>/dev/null | "$PY" -c 'import json, sys
d = json.load(sys.stdin)
sys.exit(0 if any(i["name"] == "cuda" and i.get("present") and i.get("stale") is False for i in d["images"]) else 1)'; then
  echo "the cuda image in cko-images.lock is present and up to date: not rebuilt"
  v=SKIP
  echo "build_cuda_base: cuda image: up to date in cko-images.lock, not rebuilt" > /tmp/cko-base.txt
else
  bash tests/gpu/build_cuda_base.sh
  rc=$?
  [ $rc -eq 0 ] && v=PASS || v=FAIL
fi
record $v "base+image" "$(dt "$t" "$(now)")" "$(grep -h '^build_cuda_base: \(base\|cuda image\):' /tmp/cko-base.txt 2>/dev/null | sed 's/^build_cuda_base: //; s/sha256:\([0-9a-f]\{12\}\)[0-9a-f]*/\1/' | tr '\n' ';')"

# -- 3. inside the hardened container -------------------------------------------------------------------
# cx NAME GPUS CMD...: one `cko exec` in the cuda image; JSON in $W/NAME.json, wall seconds in $W/NAME.s
cx() {
  local name=$1 gpus=$2; shift 2
  local g=() t
  [ "$gpus" != none ] && g=(--gpus "$gpus")
  t=$(now)
  "${CKO[@]}" exec --image cuda "${g[@]}" --timeout 240 --memory 16g --store "$W/store" --json \
    --mount "$W/src:/cko/in/src" -- "$@" > "$W/$name.json" 2> "$W/$name.err"
  echo $? > "$W/$name.rc"
  dt "$t" "$(now)" > "$W/$name.s"
  "$PY" - "$W/$name.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"(no JSON: {exc})"); raise SystemExit(0)
print(f"state {d.get('state')} exit {d.get('container_exit_code')} container {d.get('duration_s')} s "
      f"{d.get('message') or d.get('reason') or ''}")
print("stdout:", (d.get("stdout_tail") or "").strip()[-3000:])
err = (d.get("stderr_tail") or "").strip()
if err:
    print("stderr:", err[-2000:])
EOF
  tail -n 3 "$W/$name.err"
}
# out NAME: the container's stdout of NAME
out() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("stdout_tail") or "")' "$W/$1.json" 2>/dev/null; }
state() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("state"))' "$W/$1.json" 2>/dev/null; }

step "grant: nvidia-smi -L inside"
cx smi "$G" nvidia-smi -L
lines=$(out smi | grep -c '^GPU ')
first=$(echo "$HOST_UUIDS" | head -n 1)
if [ "$(state smi)" = succeeded ] && [ "$lines" = 1 ] && out smi | grep -q "$first"; then v=PASS; else v=FAIL; fi
record $v "grant nvidia-smi -L" "$(cat "$W/smi.s")" "$(out smi | grep '^GPU ' | tr '\n' ' ')"

step "what a command gets inside"
cx env "$G" sh -c 'echo "PATH=$PATH"; id; for t in python python3 nvcc ptxas cuobjdump nvdisasm ncu nvidia-smi; do echo "$t -> $(command -v $t)"; done;
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ls /opt/cko/driver/lib; grep -E "CapEff|NoNewPrivs" /proc/self/status;
  ls -ld /tmp; touch /probe-ro 2>&1 | head -n 1; cat /proc/mounts | grep -E " / | /tmp " ; ls /sys/class/net;
  /sbin/ldconfig -p | grep -cE "libcuda|libnvidia" ; ls /usr/local/nvidia 2>&1 | head -n 1'
if out env | grep -q 'CapEff:.*0000000000000000' && out env | grep -q 'NoNewPrivs:.*1' \
   && out env | grep -q 'Read-only file system' && out env | grep -q '^python -> /opt/cko/bin/python'; then v=PASS; else v=FAIL; fi
record $v "hardening + PATH" "$(cat "$W/env.s")" "uid $(out env | grep -o 'uid=[0-9]*'); nets: $(out env | sed -n '/^lo$/p' | tr '\n' ' ')"

step "torch inside"
cx torch "$G" python -c "import sys, torch; print(sys.executable, torch.__version__, torch.version.cuda); print(torch.cuda.get_device_name(0), torch.randn(4096, 4096, device='cuda').sum().item())"
if [ "$(state torch)" = succeeded ] && out torch | grep -q 'H200'; then v=PASS; else v=FAIL; fi
record $v "torch on GPU (python)" "$(cat "$W/torch.s")" "$(out torch | tr '\n' ' ' | cut -c1-150)"
cx torch2 "$G" /opt/cko/bin/python -I -c "import torch, pydantic, operations; print(torch.__file__, pydantic.VERSION, torch.cuda.is_available())"
if [ "$(state torch2)" = succeeded ] && out torch2 | grep -q 'True'; then v=PASS; else v=FAIL; fi
record $v "torch via /opt/cko/bin/python -I" "$(cat "$W/torch2.s")" "$(out torch2 | tr '\n' ' ' | cut -c1-150)"

step "toolkit inside"
cx tools none sh -c 'nvcc --version | tail -n 2; ncu --version | tail -n 1; cuobjdump --version | tail -n 1; nvdisasm --version | tail -n 1'
if [ "$(state tools)" = succeeded ] && out tools | grep -q 'release 13' && out tools | grep -qi 'version 20'; then v=PASS; else v=FAIL; fi
record $v "nvcc/ncu/cuobjdump" "$(cat "$W/tools.s")" "$(out tools | tr '\n' ' ' | cut -c1-160)"

cat > "$W/src/k.cu" <<'EOF'
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
__global__ void fill(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.0f * i + 1.0f; }
int main() {
  const int n = 1 << 20;
  float* d = nullptr;
  CK(cudaMalloc(&d, n * sizeof(float)));
  CK(cudaMemset(d, 0xff, n * sizeof(float)));  // poison: NaN everywhere
  fill<<<(n + 255) / 256, 256>>>(d, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  float* h = (float*)malloc(n * sizeof(float));
  CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += h[i] != 2.0f * i + 1.0f;
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("%s %s sm_%d%d: %d of %d wrong\n", bad ? "FAIL" : "ok", p.name, p.major, p.minor, bad, n);
  return bad != 0;
}
EOF
cat > "$W/src/tri.py" <<'EOF'
import torch
import triton
import triton.language as tl


@triton.jit
def add(x, y, o, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)


n = 1 << 20
x = torch.randn(n, device="cuda")
y = torch.randn(n, device="cuda")
o = torch.full_like(x, float("nan"))
add[(triton.cdiv(n, 1024),)](x, y, o, n, B=1024)
torch.cuda.synchronize()
err = (o - (x + y)).abs().max().item()
print("triton", triton.__version__, "max abs error", err, "ok" if err == 0 else "FAIL")
EOF

step "nvcc-built code inside: sm_90 SASS, and PTX only (the driver's JIT)"
cx nvcc "$G" sh -c 'set -e; nvcc -arch=sm_90 -o /tmp/k /cko/in/src/k.cu && /tmp/k;
  nvcc -gencode arch=compute_90,code=compute_90 -o /tmp/kj /cko/in/src/k.cu && cuobjdump --list-ptx /tmp/kj | head -n 2 && /tmp/kj'
n_ok=$(out nvcc | grep -c '^ok ')
[ "$n_ok" = 2 ] && v=PASS || v=FAIL
record $v "nvcc SASS + PTX JIT" "$(cat "$W/nvcc.s")" "$(out nvcc | grep -E '^(ok|FAIL)' | tr '\n' ' ')"

step "Triton inside"
cx triton "$G" python /cko/in/src/tri.py
if [ "$(state triton)" = succeeded ] && out triton | grep -q ' ok$'; then v=PASS; else v=FAIL; fi
record $v "triton JIT kernel" "$(cat "$W/triton.s")" "$(out triton | tail -n 1)"

if ! over_budget; then
  step "ncu inside, without the counters capability (expect a permission refusal unless the driver allows it)"
  cx ncu 0 sh -c 'nvcc -arch=sm_90 -o /tmp/k /cko/in/src/k.cu && ncu --clock-control none --metrics gpu__time_duration.sum /tmp/k 2>&1 | tail -n 6'
  record INFO "ncu, no SYS_ADMIN" "$(cat "$W/ncu.s")" "$(out ncu | grep -E 'ERR_|gpu__time|==PROF==|==ERROR==' | head -n 2 | tr '\n' ' ' | cut -c1-160)"
fi

# -- 4. start overhead -------------------------------------------------------------------------------
step "overhead"
IMG=$("$PY" -c 'import json; print(json.load(open(__import__("os").environ.get("CKO_IMAGES_LOCK", "cko-images.lock")))["images"]["cuda"]["image_id"])' 2>/dev/null)
raw=() nog=() gpu=()
for i in 1 2 3; do
  t=$(now); docker run --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges --init \
    -u 65534:65534 "$IMG" true >/dev/null 2>&1; raw+=("$(dt "$t" "$(now)")")
  t=$(now); "${CKO[@]}" exec --image cuda --store "$W/store" --json -- true >/dev/null 2>&1; nog+=("$(dt "$t" "$(now)")")
  t=$(now); "${CKO[@]}" exec --image cuda --gpus "$G" --store "$W/store" --json -- true >/dev/null 2>&1; gpu+=("$(dt "$t" "$(now)")")
done
t=$(now); python3 -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"; bare=$(dt "$t" "$(now)")
t=$(now); "${CKO[@]}" exec --image cuda --gpus "$G" --store "$W/store" --json -- python -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()" > "$W/torch-start.json" 2>&1; boxed=$(dt "$t" "$(now)")
record INFO "start overhead" "-" "docker run true ${raw[*]} s; cko exec true ${nog[*]} s; with GPU ${gpu[*]} s; torch first op bare $bare s, in cko exec $boxed s"
