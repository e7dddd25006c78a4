#!/usr/bin/env bash
# Make sure this Debian host can build and run cko's images: a Docker engine that answers and
# debootstrap. Installs Debian's packages when missing and starts dockerd without a bridge or
# iptables rules (no container ever needs a network). Idempotent; run as root.
set -euo pipefail

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "ensure-host: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "ensure-host: starting dockerd (--bridge=none --iptables=false)" >&2
  setsid dockerd --bridge=none --iptables=false --ip6tables=false >/tmp/dockerd.log 2>&1 < /dev/null &
fi
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then exit 0; fi
  sleep 0.5
done
echo "ensure-host: the Docker engine did not answer within 30 s; see /tmp/dockerd.log" >&2
tail -n 20 /tmp/dockerd.log >&2 || true
exit 5
