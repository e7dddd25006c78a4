#!/usr/bin/env bash
# On the lent GPU machine (root, repo root as cwd): bring up Debian's dockerd from .carry and a
# Python environment for cko. Source it: `source tests/gpu/prepare.sh`.
set -u
REPO=$(pwd)
t0=$(date +%s.%N)
mkdir -p /opt/cko-docker && tar -C /opt/cko-docker -xJf .carry/docker.tar.xz
export PATH=/opt/cko-docker/bin:$PATH
export LD_LIBRARY_PATH=/opt/cko-docker/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ! docker info >/dev/null 2>&1; then
  setsid dockerd --data-root /tmp/dkdata --bridge=none --iptables=false --ip6tables=false \
    >/tmp/dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 80); do docker info >/dev/null 2>&1 && break; sleep 0.25; done
fi
docker info >/dev/null 2>&1 || { echo "dockerd did not start"; tail -20 /tmp/dockerd.log; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cko-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/cko-site:$REPO
export CKO_WHEELHOUSE=$REPO/.carry/wheels CKO_PARSE_IMAGE=cuda
t1=$(date +%s.%N)
echo "prepare: dockerd + cko env in $(python3 -c "print(round($t1 - $t0, 1))") s"
