#!/usr/bin/env bash
# Runs HERE (the Debian dev machine, as root), before a device call: packs into .carry/ what the
# lent GPU machine lacks for cko (facts/machines.md; tests/gpu/README.md):
#   .carry/docker.tar.xz  Debian's dockerd, containerd, containerd-shim-runc-v2, runc, docker-init
#                         (tini-static) and the docker CLI in bin/, and in lib/ the shared libraries
#                         they need beyond glibc (libc, libm, libpthread, ld-linux ... come from the target)
#   .carry/wheels/        cp312 wheels the machine's Python 3.12 (/opt/torch/.venv) lacks for cko:
#                         the pydantic stack (pinned as in images/requirements-cpu.txt) and the docker SDK
# The packages are fetched with `apt-get download` (nothing is installed here) and unpacked with dpkg -x.
# Writes atomically (a new .carry replaces the old one only when complete). Usage: bash tests/gpu/make_carry.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEST="$REPO/.carry"
PY=${PYTHON:-python3}
STAGE=$(mktemp -d /tmp/cko-carry.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
ts() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }'; }
t0=$(ts)

# Debian's engine, unpacked (not installed)
mkdir -p "$STAGE/debs" "$STAGE/root" "$STAGE/new/wheels" "$STAGE/pkg/bin" "$STAGE/pkg/lib"
(cd "$STAGE/debs" && { apt-get download docker.io containerd runc tini 2>/dev/null \
  || { apt-get update -qq && apt-get download docker.io containerd runc tini; }; })
for d in "$STAGE"/debs/*.deb; do dpkg -x "$d" "$STAGE/root"; done
R="$STAGE/root"
cp -L "$R/usr/sbin/dockerd" "$R/usr/bin/docker" "$R/usr/bin/containerd" "$R/usr/bin/containerd-shim-runc-v2" \
      "$R/usr/sbin/runc" "$STAGE/pkg/bin/"
cp -L "$R/usr/bin/tini-static" "$STAGE/pkg/bin/docker-init"   # dockerd's --init (cko runs every container with it)
for bin in "$STAGE"/pkg/bin/*; do
  # static binaries (docker-init) print "not a dynamic executable": nothing to collect
  { ldd "$bin" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*) ;;
      *) cp -Ln "$lib" "$STAGE/pkg/lib/" ;;
    esac
  done
done
versions=$(cd "$STAGE/debs" && ls *.deb | sed 's/_amd64.deb//' | tr '\n' ' ')
printf '%s\n' "$versions" > "$STAGE/pkg/VERSIONS"
t1=$(ts)
# -9e: about 8 MB smaller than the default level for these Go binaries (the tree that travels is capped)
tar -C "$STAGE/pkg" -c . | xz -9e -T0 > "$STAGE/new/docker.tar.xz"
t2=$(ts)

# wheels for the GPU machine's CPython 3.12 (no index there). typing_extensions goes too: pydantic
# 2.14 needs >= 4.16, newer than the one the machine's torch environment may hold. msgspec: the
# PyTorch trace parser's decoder. six: no dependencies, in no image: the one package the GPU stack
# audit's second image adds (acceptance.sh, phase stack).
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$STAGE/new/wheels" \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing_extensions==4.16.0 docker==7.2.0 msgspec==0.23.0 six==1.17.0
t3=$(ts)

rm -rf "$DEST.old"
[ -e "$DEST" ] && mv "$DEST" "$DEST.old"
mv "$STAGE/new" "$DEST"
rm -rf "$DEST.old"
echo "make_carry: engine packages: $versions"
echo "make_carry: fetch+unpack $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s," \
     "xz $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}') s," \
     "wheels $(awk -v a="$t2" -v b="$t3" 'BEGIN{printf "%.1f", b-a}') s; total $(since "$t0") s"
echo "make_carry: libraries carried: $(ls "$STAGE/pkg/lib" | tr '\n' ' ')"
du -b "$DEST/docker.tar.xz" "$DEST/wheels" | awk '{printf "make_carry: %s %.1f MiB\n", $2, $1 / 1048576}'
ls "$DEST/wheels"
# What a device call sends: tracked + untracked-not-ignored files, plus the carried .carry (cap 64 MiB)
tree=$(cd "$REPO" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
carry=$(du -sb "$DEST" | cut -f1)
awk -v t="$tree" -v c="$carry" 'BEGIN { printf "make_carry: travels %.1f MiB (tree %.1f + .carry %.1f; cap 64)\n", (t + c) / 1048576, t / 1048576, c / 1048576; if (t + c > 60 * 1048576) exit 1 }' \
  || { echo "make_carry: too large to travel" >&2; exit 1; }
