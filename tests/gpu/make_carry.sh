#!/usr/bin/env bash
# Runs HERE (the Debian dev machine, root): packs what the lent GPU machine lacks into .carry/:
#   docker.tar.xz — Debian's dockerd, containerd, runc, docker-init and docker CLI + the shared
#                   libraries they need beyond glibc (facts/machines.md)
#   wheels/       — cp312 wheels cko needs on that machine's Python 3.12 (the rest is there)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT="$REPO/.carry"
STAGE=$(mktemp -d)
mkdir -p "$OUT/wheels" "$STAGE/debs" "$STAGE/root"
cd "$STAGE/debs"
apt-get download docker.io containerd runc tini >/dev/null
for d in *.deb; do dpkg -x "$d" "$STAGE/root"; done
B="$STAGE/pkg"
mkdir -p "$B/bin" "$B/lib"
for f in usr/sbin/dockerd usr/bin/docker usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/sbin/runc \
         usr/bin/runc usr/bin/tini-static usr/bin/docker-init usr/libexec/docker/docker-init; do
  [ -e "$STAGE/root/$f" ] && cp -L "$STAGE/root/$f" "$B/bin/" || true
done
[ -e "$B/bin/docker-init" ] || cp "$B/bin/tini-static" "$B/bin/docker-init"
for bin in "$B"/bin/*; do
  ldd "$bin" 2>/dev/null | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libresolv.so*) ;;
      *) [ -f "$lib" ] && cp -Ln "$lib" "$B/lib/" || true ;;
    esac
  done || true  # static binaries (docker-init) have no libraries
done
tar -C "$B" -cJf "$OUT/docker.tar.xz" .
py() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$OUT/wheels" "$@"; }
py pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 docker==7.2.0
rm -rf "$STAGE"
du -sh "$OUT/docker.tar.xz" "$OUT/wheels"
ls "$OUT/wheels"
