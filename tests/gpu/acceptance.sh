#!/usr/bin/env bash
# GPU acceptance on the lent H200 (README.md): bash tests/gpu/acceptance.sh [PHASE ...]
# Phases, in the order given (default: all of them, in this order):
#   loops        readiness, baseline, variant, screen, target, champion select, audit, report, verify
#                on torch-layernorm and on cuda-reduce, inside containers
#   ceilings     the H200's copy bandwidth and bf16 matmul rate, bare on the host (tests/gpu/ceilings.py)
#   grant        `cko exec --gpus 0 -- nvidia-smi -L`: exactly the granted UUID inside
#   overhead     torch's first CUDA op bare vs in `cko exec`; the cuda-reduce driver bare vs containerised
#   ncu          `cko profile ncu --collect` on the cuda-reduce Target (counters allowed by a policy file)
#   sass         `cko sass --binary` on the candidate's sm_90a cubin (cuobjdump in the cuda image)
#   adversarial  the GPU adversarial candidates (tests/adversarial/gpu) through pytest -m gpu (ADV_K: a -k subset)
#   aa           20 A/A target experiments (identical variant) on torch-layernorm: the false-positive rate
#   parse        benchmarks/parse_speed.py on one core of the GPU host (not in the default list)
#   fidelity     benchmarks/fidelity.py: cko's cold/hot/graph gains beside ncu's and do_bench's (issue 18)
#   reach        the Triton and torch.compile candidates to a target verdict, and graph mode (pytest -k)
#   wall         benchmarks/verdict_wall.py in cold and graph mode: a screen + target's wall vs do_bench's
#   torchtrace   `cko profile torch --collect` on torch-layernorm: the trace bound and parsed (issue 25)
#   tritonstages the Triton candidate's cache (TTIR/TTGIR/LLIR/PTX) through `cko sass --triton`, bound
#   stack        `cko audit --stack`: cuda against cuda plus one package (image), and a refusal
#   pytest       every test marked gpu (python3 -m pytest -m gpu tests): the loops again as assertions, the
#                adversarial suite, the examples' drivers on the GPU (not in the default list: it repeats)
# A phase is started only while fewer than ACC_DEADLINE_S seconds (default 540) have passed since this
# script started, so a call ends inside the device tool's 600 s; the next call on the same (warm)
# machine reuses the engine, the image and the stores under /tmp/acc and runs the phases not yet done.
# Writes a log, summary.txt and a tarball of every JSON/XML/HTML result to $OUT (or ./gpu-out).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=/tmp/acc; mkdir -p $W
START=$(date +%s)
DEADLINE=${ACC_DEADLINE_S:-540}
PHASES=("$@"); [ ${#PHASES[@]} -eq 0 ] && PHASES=(loops ceilings grant overhead ncu sass adversarial aa)
step() { echo "=== [$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
finish() {
  tar -C $W -czf "$OUT/acceptance.tar.gz" --exclude='*/objects' --exclude='*/invocations' --exclude='*/scratch' . 2>/dev/null
  python3 tests/gpu/summarize.py $W | tee "$OUT/summary.txt"
}
trap finish EXIT
step prepare; source tests/gpu/prepare.sh || exit 5
if ! python3 -m cko_perf images list --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(i["name"]=="cuda" and i.get("present") and not i.get("stale") for i in d["images"]) else 1)'; then
  step "build cuda base + image"; bash tests/gpu/build_cuda_base.sh || exit 5
fi
[ -s $W/doctor.json ] || { step doctor; python3 -m cko_perf doctor --json > $W/doctor.json; }

target_of() {  # target_of EXAMPLE: the Target id from the loop's readiness (runs readiness if missing)
  local f=$W/$1.readiness.json
  if ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))["target"]["id"]' "$f" >/dev/null 2>&1; then
    python3 -m cko_perf readiness --request examples/$1/readiness.json --store $W/$1 --json > "$f"
  fi
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["target"]["id"])' "$f"
}

phase_loops() {
  for ex in torch-layernorm cuda-reduce; do
    [ -s $W/$ex.verify.json ] && { echo "loop $ex: done before"; continue; }
    [ "$(left)" -gt 150 ] || { echo "loop $ex: no time left"; return 1; }
    step "loop $ex"; bash tests/gpu/loop.sh $ex $W/$ex
  done
}

phase_ceilings() {
  [ -s $W/ceilings.json ] || python3 tests/gpu/ceilings.py > $W/ceilings.json
  cat $W/ceilings.json
}

phase_grant() {
  python3 -m cko_perf exec --image cuda --gpus 0 --json -- nvidia-smi -L > $W/exec-smi.json; echo "rc=$?"
  python3 -c 'import json; d=json.load(open("/tmp/acc/exec-smi.json")); print(d["state"], d["stdout_tail"].strip(), d["identity"]["devices"][0]["uuid"], d["probe"]["gpus"])'
}

phase_overhead() {
  local b0 b1 b2
  b0=$(date +%s.%N); python3 -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"; b1=$(date +%s.%N)
  python3 -m cko_perf exec --image cuda --gpus 0 --json -- python -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()" > $W/exec-torch.json; b2=$(date +%s.%N)
  echo "torch first op: bare $(python3 -c "print(round($b1 - $b0, 2))") s, in cko exec $(python3 -c "print(round($b2 - $b1, 2))") s" | tee $W/overhead.txt
  # The same driver and request bare on the host and as a cko invocation (tests/gpu/overhead.py).
  python3 tests/gpu/overhead.py $W/overhead-driver.json 2>&1 | tail -n 5 | tee -a $W/overhead.txt
}

phase_ncu() {  # the original, then the candidate (a variant of the same Target)
  local T V; T=$(target_of cuda-reduce)
  printf 'max_timeout_s: 3600\n' > $W/policy.yaml  # no capability is ever added (issue 20)
  printf '{"subject": "original", "reps": 2}\n' > $W/collect.json
  python3 -m cko_perf profile ncu --collect --request $W/collect.json --target "$T" --policy $W/policy.yaml \
    --store $W/cuda-reduce --json > $W/ncu-collect.json; echo "rc=$?"
  head -c 1500 $W/ncu-collect.json; echo
  V=$(python3 -m cko_perf variant --request examples/cuda-reduce/variant.json --target "$T" --store $W/cuda-reduce --json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["variant"]["id"])')
  printf '{"subject": "%s", "reps": 1}\n' "$V" > $W/collect-candidate.json
  python3 -m cko_perf profile ncu --collect --request $W/collect-candidate.json --target "$T" --policy $W/policy.yaml \
    --store $W/cuda-reduce --json > $W/ncu-collect-candidate.json; echo "rc=$?"
}

phase_sass() {
  nvcc -arch=sm_90a -cubin -o $W/reduce_candidate.cubin examples/cuda-reduce/candidate/kernel.cu && \
    python3 -m cko_perf sass --binary $W/reduce_candidate.cubin --store $W/cuda-reduce --json > $W/sass.json; echo "rc=$?"
  head -c 1200 $W/sass.json; echo
}

phase_adversarial() {
  # bounded by what is left, and every test's line kept as it comes: a cut call still says which ran
  CKO_GPU_EVIDENCE_DIR=$W timeout $(( $(left) + 20 )) python3 -m pytest -v -p no:cacheprovider -m gpu tests/gpu/test_gpu_acceptance.py \
    -k "adversarial${ADV_K:+ and ($ADV_K)}" --junitxml $W/adversarial.xml 2>&1 | tee $W/adversarial-full.txt | grep -E "PASSED|FAILED|ERROR|passed|failed" \
    | tail -n 25 | tee $W/adversarial.txt
  grep -q " passed" $W/adversarial.txt && ! grep -qE " (failed|error)" $W/adversarial.txt
}

phase_parse() {  # the parsers' speed on one core of this host (#6's goals), bare: no GPU involved
  python3 benchmarks/parse_speed.py --ncu-mb 50 --trace-events 1000000 --repeat 3 2>&1 | tee $W/parse.txt
  grep -q "events/s" $W/parse.txt
}

phase_pytest() {
  python3 -m pytest -q -p no:cacheprovider -m gpu tests ${PYTEST_K:+-k "$PYTEST_K"} --junitxml $W/pytest-gpu.xml 2>&1 \
    | tail -n 40 | tee $W/pytest-gpu.txt
  grep -q " passed" $W/pytest-gpu.txt && ! grep -qE " (failed|error)" $W/pytest-gpu.txt
}

phase_aa() {  # each A/A its own snapshot (one formal target stage counts per snapshot): a comment apart
  local TT AV i
  TT=$(target_of torch-layernorm)
  touch $W/aa.jsonl
  for i in $(seq $(( $(wc -l < $W/aa.jsonl) + 1 )) 20); do
    [ "$(left)" -gt 15 ] || { echo "stopping A/A at $i: time"; return 1; }
    mkdir -p $W/same-$i && { cat examples/torch-layernorm/kernel.py; echo "# A/A control $i"; } > $W/same-$i/kernel.py
    printf '{"path": "%s", "claim": "identical: A/A control %d"}\n' "$W/same-$i" "$i" > $W/aa-variant.json
    AV=$(python3 -m cko_perf variant --request $W/aa-variant.json --target "$TT" --store $W/torch-layernorm --json \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["variant"]["id"])')
    printf '{"stage": "target", "pairs": 10, "seed": %d}\n' "$i" > $W/aa-exp.json
    local t0; t0=$(date +%s.%N)
    python3 -m cko_perf experiment --request $W/aa-exp.json --target "$TT" --variant "$AV" --store $W/torch-layernorm --json \
      | python3 -c 'import json,sys,time; d=json.load(sys.stdin); print(json.dumps({"outcome": d.get("outcome") or d.get("stage_outcome"), "codes": d.get("reason_codes"), "cases": [{"verdict": c.get("case_verdict"), "effect_pct": c.get("effect_pct"), "excluded": c.get("excluded")} for c in d.get("cases") or []], "seconds": round(time.time() - float(sys.argv[1]), 1)}))' "$t0" >> $W/aa.jsonl
    tail -n 1 $W/aa.jsonl | cut -c 1-300
  done
}

phase_fidelity() {
  python3 benchmarks/fidelity.py --blocks 12 --out $W/fidelity.json 2>&1 | tee $W/fidelity.txt
  [ -s $W/fidelity.json ]
}

phase_reach() {
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_acceptance.py -k "reach or graph_mode" \
    --junitxml $W/reach.xml 2>&1 | tail -n 30 | tee $W/reach.txt
  grep -q " passed" $W/reach.txt && ! grep -qE " (failed|error)" $W/reach.txt
}

phase_wall() {
  local m
  for m in cold graph; do
    [ -s $W/wall-$m.json ] && continue
    python3 benchmarks/verdict_wall.py --mode $m --out $W/wall-$m.json 2>&1 | tail -n 18 | tee -a $W/wall.txt
  done
  [ -s $W/wall-cold.json ] && [ -s $W/wall-graph.json ]
}

phase_torchtrace() {
  local T; T=$(target_of torch-layernorm)
  printf '{"subject": "original", "reps": 2}\n' > $W/tcollect.json
  python3 -m cko_perf profile torch --collect --request $W/tcollect.json --target "$T" --store $W/torch-layernorm \
    --json > $W/torch-collect.json; echo "rc=$?"
  python3 tests/gpu/show_trace.py $W/torch-collect.json | tee $W/torch-collect.txt
}

phase_tritonstages() {
  local T V; T=$(target_of torch-layernorm)
  V=$(python3 -m cko_perf variant --request examples/torch-layernorm/variant.json --target "$T" --store $W/torch-layernorm \
    --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["variant"]["id"])')
  rm -rf $W/tcache; TRITON_CACHE_DIR=$W/tcache python3 tests/gpu/run_subject.py examples/torch-layernorm \
    examples/torch-layernorm/candidate/kernel.py '{"rows": 4096, "cols": 4096, "dtype": "bf16"}'
  python3 -m cko_perf sass --triton $W/tcache --target "$T" --subject "$V" --store $W/torch-layernorm --json \
    > $W/triton-stages.json; echo "rc=$?"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in d if k != "facts"})[:600]); print(json.dumps(d.get("facts"))[:2500])' $W/triton-stages.json
}

phase_stack() {  # two builds of cko's cuda image that differ in one package (six), one Target on each
  local A B img
  stack_target() {  # stack_target NAME: readiness of torch-layernorm (8192x4096) in the lock's cuda image now
    python3 - > examples/torch-layernorm/stack-$1.json <<'PY'
import json
req = json.load(open("examples/torch-layernorm/readiness.json"))
req["cases"] = [{"id": "bf16_8192x4096", "params": {"rows": 8192, "cols": 4096, "dtype": "bf16"}}]
print(json.dumps(req))
PY
    python3 -m cko_perf readiness --request examples/torch-layernorm/stack-$1.json --store $W/stack --json > $W/stack-$1.readiness.json
    echo "readiness $1 rc=$?" >&2; rm -f examples/torch-layernorm/stack-$1.json
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["target"]["id"])' $W/stack-$1.readiness.json
  }
  A=$(stack_target before)
  { cat images/requirements-host.txt; echo six==1.17.0; } > images/requirements-stack.txt
  python3 -m cko_perf images build cuda --base-image cko/cuda-base:host --build-arg PYTHON=/opt/torch/.venv/bin/python3 \
    --build-arg REQUIREMENTS=images/requirements-stack.txt --json > $W/stack-build.json; echo "build rc=$?"
  B=$(stack_target after)
  python3 -m cko_perf audit --stack --from "$A" --to "$B" --component torch --store $W/stack --json > $W/stack-refused.json
  echo "declared torch: rc=$?"; head -c 700 $W/stack-refused.json; echo
  python3 -m cko_perf audit --stack --from "$A" --to "$B" --component image --rounds 3 --store $W/stack --json \
    > $W/stack-audit.json; echo "declared image: rc=$?"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d.get(k) for k in ("answer", "differs", "unchecked", "cases", "images", "error", "message")})[:2500])' $W/stack-audit.json
}

# seconds a phase needs at least (estimates; README.md has what each took); not started with less left
declare -A NEED=([loops]=150 [ceilings]=30 [grant]=15 [overhead]=40 [ncu]=60 [sass]=20 [adversarial]=150 [aa]=30 [pytest]=150 [parse]=90 [fidelity]=150 [reach]=200 [wall]=150 [torchtrace]=60 [tritonstages]=40 [stack]=120)
for p in "${PHASES[@]}"; do
  if [ -e $W/done.$p ]; then echo "phase $p: done before"; continue; fi
  if [ "$(left)" -le "${NEED[$p]:-30}" ]; then echo "phase $p: not started, $(left) s left, needs ${NEED[$p]:-30}"; continue; fi
  step "phase $p"
  "phase_$p" && touch $W/done.$p
done
step done
