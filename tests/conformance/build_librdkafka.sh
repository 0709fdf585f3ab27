#!/usr/bin/env bash
# Build librdkafka 2.0.2's test suite (tests/test-runner) from Debian bookworm's source package.
#
# Idempotent and cached: the result lives in <repo>/.cache/librdkafka and a stamp file marks a
# finished build, so a second run returns at once. Details go to <cache>/build.log; the terminal
# gets one line per step. Exits non-zero with a clear message when a step fails.
#
# Prints nothing but the step lines; the pytest module in this folder reads the tree from
# <cache>/librdkafka-2.0.2.
set -euo pipefail

VERSION=2.0.2
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
# rapidjson-dev: configure enables the tests that check the statistics JSON (0053, 0110) only when
# it finds rapidjson/schema.h; without it they skip themselves.
BUILD_DEPS=(libzstd-dev liblz4-dev libsasl2-dev libssl-dev zlib1g-dev rapidjson-dev)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache="$repo/.cache/librdkafka"
tree="$cache/librdkafka-$VERSION"
stamp="$cache/.built-$VERSION"
# What the stamp records: a build made with other dependencies (e.g. before rapidjson-dev was one)
# configured other tests in or out, so it is rebuilt.
build_id="librdkafka $VERSION; deps ${BUILD_DEPS[*]}"
log="$cache/build.log"

say() { echo "build_librdkafka: $*"; }

# Runs one step with its output in the log; on failure names the step and shows the log's tail.
step() {
    local what=$1
    shift
    say "$what"
    echo "=== $what: $*" >>"$log"
    if ! "$@" >>"$log" 2>&1; then
        say "FAILED: $what (full log: $log); last lines:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
}

mkdir -p "$cache"

# Two concurrent runs (two pytest sessions, make -j) must not build into the same tree.
exec 9>"$cache/.lock"
flock 9

if [[ -f "$stamp" && "$(cat "$stamp")" == "$build_id" && -x "$tree/tests/test-runner" ]]; then
    say "cached build in $tree"
    exit 0
fi

: >"$log"
say "building librdkafka $VERSION tests in $cache (log: $log)"

missing=()
for pkg in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# A C and C++ compiler and make: test-runner links C++ tests too.
command -v gcc >/dev/null && command -v g++ >/dev/null && command -v make >/dev/null || missing+=(build-essential)
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        say "FAILED: missing packages ${missing[*]} and not root; install them with apt-get" >&2
        exit 1
    fi
    step "apt-get update" apt-get update
    step "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

tarball="$cache/librdkafka_$VERSION.orig.tar.gz"
if [[ ! -f "$tarball" ]]; then
    # The machine has no deb-src lines: give apt a private sources list and package-list folder so
    # the system's apt state is left alone. apt checks the download against the signed index.
    aptdir="$cache/apt"
    rm -rf "$aptdir"
    mkdir -p "$aptdir/lists/partial" "$aptdir/download"
    echo "deb-src $MIRROR $SUITE main" >"$aptdir/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$aptdir/sources.list" -o Dir::Etc::sourceparts=/dev/null
              -o "Dir::State::Lists=$aptdir/lists")
    step "apt-get update (deb-src $SUITE)" apt-get "${apt_opts[@]}" update
    step "apt-get source librdkafka" \
        bash -c 'cd "$1" && shift && apt-get "$@" source --download-only librdkafka' _ "$aptdir/download" "${apt_opts[@]}"
    [[ -f "$aptdir/download/librdkafka_$VERSION.orig.tar.gz" ]] || {
        say "FAILED: $SUITE's source package is not librdkafka $VERSION: $(ls "$aptdir/download")" >&2
        exit 1
    }
    step "keep $(basename "$tarball")" mv "$aptdir/download/librdkafka_$VERSION.orig.tar.gz" "$tarball"
    rm -rf "$aptdir"
fi

# Always unpack afresh: a half-built tree from an interrupted run is not worth reasoning about.
rm -rf "$tree"
# A tarball that does not unpack is dropped, so the next run downloads it again.
step "unpack" bash -c 'tar -xzf "$1" -C "$2" || { rm -f "$1"; echo "removed $1"; exit 1; }' _ "$tarball" "$cache"
[[ -d "$tree" ]] || { say "FAILED: $tarball did not unpack to $tree" >&2; exit 1; }
step "configure" bash -c 'cd "$1" && ./configure --disable-curl --disable-gssapi' _ "$tree"
grep -q '^#define WITH_RAPIDJSON 1' "$tree/config.h" || {
    say "FAILED: configure did not find rapidjson (rapidjson-dev); 0053 and 0110 would skip themselves" >&2
    exit 1
}
step "make libs" make -C "$tree" -j2 libs
step "make tests" make -C "$tree/tests" -j2 build
[[ -x "$tree/tests/test-runner" ]] || { say "FAILED: no $tree/tests/test-runner after make" >&2; exit 1; }
echo "$build_id" >"$stamp"
say "done: $tree/tests/test-runner"
