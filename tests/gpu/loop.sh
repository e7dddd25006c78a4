#!/usr/bin/env bash
# The whole loop on one example inside containers on the GPU: loop.sh EXAMPLE STORE
set -u
EX=examples/$1; ST=$2
c() { python3 -m cko_perf "$@" --store "$ST" --json; }
T=$(c readiness --request $EX/readiness.json | tee $ST.readiness.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["target"]["id"])')
echo "target $T"
c baseline --request $EX/baseline.json --target "$T" > $ST.baseline.json; echo "baseline rc=$?"
V=$(c variant --request $EX/variant.json --target "$T" | python3 -c 'import json,sys; print(json.load(sys.stdin)["variant"]["id"])')
c experiment --request $EX/screen.json --target "$T" --variant "$V" > $ST.screen.json; echo "screen rc=$?"
c experiment --request $EX/target.json --target "$T" --variant "$V" > $ST.target.json; echo "target rc=$?"
E=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["experiment"]["id"])' $ST.target.json)
c champion select --experiment "$E" > $ST.select.json; echo "select rc=$?"
c audit --junit $ST.audit.xml > $ST.audit.json; echo "audit rc=$?"
c report --html $ST.report.html > /dev/null; c verify > $ST.verify.json; echo "verify rc=$?"
