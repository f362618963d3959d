#!/usr/bin/env bash
# Build ps-lite's library and our driver (bench/pslite/pushpull.cc) against Debian's libzmq and
# protobuf, outside the repository: the peer of bench/pushpull.py (issue 44.3).  `make pslite` runs it.
#
#   bench/pslite/build.sh [--pslite-src DIR]
#
# The source, in this order: --pslite-src DIR or $PSLITE_SRC (a ps-lite checkout or bare git
# directory: its commit $PSLITE_COMMIT is exported; a plain source tree is taken as it is);
# else the local mirror /work/.mirror/dmlc+ps-lite/repo where it exists; else a clone of
# https://github.com/dmlc/ps-lite.  $PSLITE_COMMIT defaults to the pinned 15b8adf (master's head,
# 2026-03-02, when this was written).
#
# ps-lite's own Makefile downloads zmq and protobuf from the internet: this script uses its
# CMakeLists.txt instead (which finds the system's libzmq, and regenerates meta.pb.{h,cc} with the
# system's protoc 3.21), builds the `pslite` target alone, then links our driver against it with g++.
#
# Output, under $PSLITE_CACHE (default ~/.cache/paramserver/pslite) / <commit>: src/ (ps-lite's
# source), build/ (its CMake build), bin/pushpull (our driver).  bench/pslite/driver.py finds the
# driver there (or at $PSLITE_DRIVER).  Nothing is written into the repository.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
COMMIT=${PSLITE_COMMIT:-15b8adf17e9871ff6112c80e4b290fa38c2b4656}
MIRROR=/work/.mirror/dmlc+ps-lite/repo
SRC_FROM=${PSLITE_SRC:-}

while [ $# -gt 0 ]; do
    case $1 in
        --pslite-src) [ $# -ge 2 ] || { echo "build.sh: --pslite-src needs a directory" >&2; exit 2; }
                      SRC_FROM=$2; shift 2 ;;
        --pslite-src=*) SRC_FROM=${1#*=}; shift ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown argument $1 (usage: build.sh [--pslite-src DIR])" >&2; exit 2 ;;
    esac
done

CACHE=${PSLITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paramserver/pslite}
OUT=$CACHE/${COMMIT:0:7}
case "$OUT/" in
    "$(cd "$HERE/../.." && pwd)"/*) echo "build.sh: $OUT is inside the repository: set PSLITE_CACHE elsewhere" >&2
                                    exit 2 ;;
esac

# Debian's packages (root, or sudo, installs them), as the Makefile does for chromium
if command -v dpkg-query >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    missing=()
    for pkg in libzmq3-dev libprotobuf-dev protobuf-compiler cmake g++ git; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "build.sh: installing ${missing[*]} (apt-get)" >&2
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
    fi
else
    echo "build.sh: not Debian (no dpkg-query): libzmq, protobuf with protoc, cmake and g++ must be installed" >&2
fi

# the source: checked before the last build is cleared
if [ -z "$SRC_FROM" ] && [ -d "$MIRROR" ]; then
    SRC_FROM=$MIRROR
fi
CLONE=$CACHE/clone-$$
trap 'rm -rf "$CLONE"' EXIT
if [ -z "$SRC_FROM" ]; then
    echo "build.sh: cloning https://github.com/dmlc/ps-lite for $COMMIT" >&2
    git clone --quiet https://github.com/dmlc/ps-lite "$CLONE" || {
        echo "build.sh: could not clone https://github.com/dmlc/ps-lite (no network?): give a checkout with" \
             "--pslite-src DIR (or PSLITE_SRC), or put a bare mirror at $MIRROR" >&2
        exit 2; }
    SRC_FROM=$CLONE
fi
if [ ! -d "$SRC_FROM" ]; then
    echo "build.sh: ps-lite's source $SRC_FROM is not a directory (--pslite-src or PSLITE_SRC)" >&2
    exit 2
fi
gitdir=$(git --git-dir="$SRC_FROM" rev-parse --git-dir 2>/dev/null || git -C "$SRC_FROM" rev-parse --absolute-git-dir 2>/dev/null || true)
if [ -n "$gitdir" ]; then
    git --git-dir="$gitdir" cat-file -e "$COMMIT^{commit}" 2>/dev/null || {
        echo "build.sh: $SRC_FROM has no commit $COMMIT (fetch it, or set PSLITE_COMMIT)" >&2; exit 2; }
elif [ ! -f "$SRC_FROM/include/ps/ps.h" ]; then
    echo "build.sh: $SRC_FROM is not ps-lite's source (no include/ps/ps.h)" >&2
    exit 2
fi

# a fresh tree: a build never mixes two
rm -rf "$OUT/src" "$OUT/build" "$OUT/bin"
mkdir -p "$OUT/src" "$OUT/bin"
if [ -n "$gitdir" ]; then
    git --git-dir="$gitdir" archive "$COMMIT" | tar -x -C "$OUT/src"
    echo "build.sh: ps-lite $COMMIT from $SRC_FROM" >&2
else
    cp -a "$SRC_FROM/." "$OUT/src/"
    COMMIT=unchecked
    echo "build.sh: ps-lite from the plain tree $SRC_FROM (not a git checkout: its commit is not checked)" >&2
fi

# ps-lite's library: its CMakeLists, Release (-O3), the `pslite` target alone (not its tests)
cmake -S "$OUT/src" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 || {
    tail -30 "$OUT/cmake.log" >&2; echo "build.sh: ps-lite's cmake failed (log: $OUT/cmake.log)" >&2; exit 1; }
cmake --build "$OUT/build" --target pslite -j "$(nproc)" >"$OUT/build.log" 2>&1 || {
    tail -30 "$OUT/build.log" >&2; echo "build.sh: ps-lite's build failed (log: $OUT/build.log)" >&2; exit 1; }

# our driver, with the same optimisation as ps-lite's Release build
g++ -O3 -DNDEBUG -std=c++14 -Wall -DPSLITE_COMMIT="\"${COMMIT:0:7}\"" -I "$OUT/src/include" \
    "$HERE/pushpull.cc" "$OUT/build/libpslite.a" -lprotobuf -lzmq -pthread -o "$OUT/bin/pushpull"
echo "$OUT/bin/pushpull"
