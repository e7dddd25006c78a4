#!/usr/bin/env bash
# On the lent GPU machine: a base image from the host's own userland, CUDA toolkit, Nsight
# Compute and torch environment (no registry there), then cko's cuda image on it.
# The driver's libraries (/usr/local/nvidia) stay out: passthrough mode `devices` binds them.
set -u
t0=$(date +%s.%N)
dirs=""
for d in bin sbin lib lib64 usr etc opt/torch opt/nvidia; do [ -e "/$d" ] && dirs="$dirs $d"; done
tar -C / -c --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/locale \
  --exclude=./usr/local/nvidia --exclude=./usr/src --exclude=./usr/lib/firmware --exclude='__pycache__' \
  --exclude=./etc/shadow --exclude=./etc/ssh $dirs 2>/dev/null | docker import - cko/cuda-base:host >/tmp/base.id
t1=$(date +%s.%N)
BASE=$(docker image inspect -f '{{.Id}}' cko/cuda-base:host)
echo "base: $BASE $(docker image inspect -f '{{.Size}}' cko/cuda-base:host) bytes in $(python3 -c "print(round($t1 - $t0, 1))") s"
python3 -m runner images build cuda --base-image "$BASE" --build-arg PYTHON=/opt/torch/.venv/bin/python3 \
  --build-arg REQUIREMENTS=images/requirements-host.txt --json > /tmp/cuda-build.json
t2=$(date +%s.%N)
echo "cuda image: $(python3 -c 'import json; e=json.load(open("/tmp/cuda-build.json"))["built"][0]; print(e["image_id"], e["size_bytes"])') in $(python3 -c "print(round($t2 - $t1, 1))") s"
