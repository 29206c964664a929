#!/bin/bash
# Cold times of the README's two commands: a fresh clone of REV (default main), a new
# CARGO_HOME, no target directory, in /tmp/cold; prints each command's wall time.
set -u
REV=${1:-main}
C=/tmp/cold
rm -rf $C && mkdir -p $C
REPO=${REPO:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
git clone -q "$REPO" $C/src
cd $C/src
git checkout -q "$REV"
export CARGO_HOME=$C/cargo-home
unset CARGO_TARGET_DIR
export PATH=$HOME/.cargo/bin:$PATH
t0=$(date +%s)
echo "start $(date -Is) rev $(git rev-parse --short HEAD)"
scripts/install-build-deps.sh > $C/deps.log 2>&1
cargo build --release --bins --timings > $C/build.log 2>&1
rc=$?
t1=$(date +%s)
echo "command 1 build: rc=$rc $((t1-t0)) s"
target/release/quorum dev > $C/dev.log 2>&1 &
pid=$!
while ! grep -q "Quorum dev cluster" $C/dev.log; do sleep 1; if ! kill -0 $pid 2>/dev/null; then echo "quorum dev died"; break; fi; done
t2=$(date +%s)
echo "command 1 to quorum dev running: $((t2-t0)) s"
kill -INT $pid; sleep 3; kill -9 $pid 2>/dev/null
cp target/cargo-timings/cargo-timing.html $C/timing1.html 2>/dev/null
t3=$(date +%s)
cargo test --release --workspace > $C/test.log 2>&1
rc=$?
t4=$(date +%s)
echo "command 2: rc=$rc $((t4-t3)) s; librocksdb-sys compiled again: $(grep -c 'Compiling librocksdb-sys' $C/test.log)"
grep -E "^test result" $C/test.log | awk '{p+=$4; f+=$6} END {print "tests passed", p, "failed", f}'
echo "end $(date -Is)"
