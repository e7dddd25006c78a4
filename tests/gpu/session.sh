#!/usr/bin/env bash
# One device call on the lent H200 (README.md): bash tests/gpu/session.sh [PHASE ...]
# On a fresh machine: smoke.sh first (engine, base + cuda image, checks inside the container), then the
# acceptance phases (acceptance.sh; default: all) within what is left of SESSION_BUDGET_S (default 570 s,
# under the device tool's 600 s per call). On a warm machine the smoke is not repeated and the phases
# already done are skipped, so calling it again continues where the last call stopped.
# $OUT gets few files (the device tool returns at most 8): session.log, smoke-summary.txt,
# summary.txt and all.tar.gz (every log, JSON, XML and HTML the two scripts wrote).
set -u
export PYTHONUNBUFFERED=1
S=$(date +%s)
BUDGET=${SESSION_BUDGET_S:-570}
FINAL=${OUT:-$PWD/gpu-out}; mkdir -p "$FINAL"
STAGE=/tmp/cko-session; mkdir -p $STAGE/smoke $STAGE/acc
exec > >(tee -a "$FINAL/session.log") 2>&1
pack() {
  cp $STAGE/smoke/summary.txt "$FINAL/smoke-summary.txt" 2>/dev/null
  cp $STAGE/acc/summary.txt "$FINAL/summary.txt" 2>/dev/null
  tar -C $STAGE -czf "$FINAL/all.tar.gz" . 2>/dev/null
}
trap pack EXIT
if [ ! -e /tmp/acc/done.smoke ]; then
  OUT=$STAGE/smoke SMOKE_BUDGET_S=$(( BUDGET / 2 )) bash tests/gpu/smoke.sh; mkdir -p /tmp/acc; touch /tmp/acc/done.smoke
fi
OUT=$STAGE/acc ACC_DEADLINE_S=$(( BUDGET - ($(date +%s) - S) )) bash tests/gpu/acceptance.sh "$@"
echo "session: $(( $(date +%s) - S )) s"
