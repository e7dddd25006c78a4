#!/usr/bin/env bash
# GPU acceptance on the lent H200, one command (README.md): bash tests/gpu/acceptance.sh [all|phase2]
# Writes a log and a tarball of every JSON/XML/HTML result to $OUT (or ./gpu-out).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=/tmp/acc; mkdir -p $W
START=$(date +%s)
step() { echo "=== [$(( $(date +%s) - START ))s] $*"; }
finish() {
  tar -C $W -czf "$OUT/acceptance.tar.gz" --exclude='*/objects' --exclude='*/invocations' --exclude='*/scratch' . 2>/dev/null
  python3 tests/gpu/summarize.py $W | tee "$OUT/summary.txt"
}
trap finish EXIT
step prepare; source tests/gpu/prepare.sh
if ! python3 -m runner images list --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(i["name"]=="cuda" and i.get("present") and not i.get("stale") for i in d["images"]) else 1)'; then
  step "build cuda base + image"; bash tests/gpu/build_cuda_base.sh
fi
step doctor; python3 -m runner doctor --json > $W/doctor.json; echo "doctor rc=$?"
python3 -c 'import json; d=json.load(open("/tmp/acc/doctor.json")); print([ (x["name"], x["uuid"]) for x in d["gpu"]["devices"]], d["gpu"]["driver_version"], [m["mode"] for m in d["passthrough"] if m["usable"]])'
if [ "${1:-all}" = all ]; then
  step ceilings; python3 tests/gpu/ceilings.py > $W/ceilings.json
  step "grant check"; python3 -m runner exec --image cuda --gpus 0 --json -- nvidia-smi -L > $W/exec-smi.json; echo "rc=$?"
  python3 -c 'import json; d=json.load(open("/tmp/acc/exec-smi.json")); print(d["state"], d["stdout_tail"].strip(), d["identity"]["devices"][0]["uuid"])'
  step overhead
  b0=$(date +%s.%N); python3 -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"; b1=$(date +%s.%N)
  python3 -m runner exec --image cuda --gpus 0 --json -- python -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()" > $W/exec-torch.json; b2=$(date +%s.%N)
  echo "overhead: bare $(python3 -c "print(round($b1 - $b0, 2))") s, containerised $(python3 -c "print(round($b2 - $b1, 2))") s (state $(python3 -c 'import json; print(json.load(open("/tmp/acc/exec-torch.json"))["state"])'))" | tee $W/overhead.txt
  step "loop torch-layernorm"; bash tests/gpu/loop.sh torch-layernorm $W/torch-layernorm
  step "loop cuda-reduce"; bash tests/gpu/loop.sh cuda-reduce $W/cuda-reduce
fi
if [ $(( $(date +%s) - START )) -lt 400 ] || [ "${1:-all}" = phase2 ]; then
  ST=$W/cuda-reduce; T=$(python3 -c 'import json; print(json.load(open("/tmp/acc/cuda-reduce.readiness.json"))["target"]["id"])')
  step "ncu collect"
  printf 'allow_profiler_counters: true\n' > $W/policy.yaml
  printf '{"subject": "original", "reps": 2}\n' > $W/collect.json
  python3 -m runner profile ncu --collect --request $W/collect.json --target "$T" --policy $W/policy.yaml --store $ST --json > $W/ncu-collect.json; echo "rc=$?"
  head -c 1500 $W/ncu-collect.json; echo
  step "sass --binary"
  nvcc -arch=sm_90a -cubin -o $W/reduce_candidate.cubin examples/cuda-reduce/candidate/kernel.cu && \
    python3 -m runner sass --binary $W/reduce_candidate.cubin --store $ST --json > $W/sass.json; echo "rc=$?"
  head -c 1200 $W/sass.json; echo
  step "20 A/A experiments"
  TT=$(python3 -c 'import json; print(json.load(open("/tmp/acc/torch-layernorm.readiness.json"))["target"]["id"])')
  mkdir -p $W/same && cp examples/torch-layernorm/kernel.py $W/same/
  printf '{"path": "%s", "claim": "identical: A/A control"}\n' "$W/same" > $W/aa-variant.json
  AV=$(python3 -m runner variant --request $W/aa-variant.json --target "$TT" --store $W/torch-layernorm --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["variant"]["id"])')
  : > $W/aa.jsonl
  for i in $(seq 1 20); do
    [ $(( $(date +%s) - START )) -gt 540 ] && { echo "stopping A/A at $i: time"; break; }
    printf '{"stage": "target", "pairs": 10, "seed": %d}\n' "$i" > $W/aa-exp.json
    python3 -m runner experiment --request $W/aa-exp.json --target "$TT" --variant "$AV" --store $W/torch-layernorm --json \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"outcome": d.get("outcome"), "cases": d.get("cases")}))' >> $W/aa.jsonl
  done
fi
step done
