#!/bin/bash
# 20 consecutive runs of tests/kill9.rs beside two busy loops (stress -c 2's load; `stress` is
# not installed on the dev VM). It runs copies of the binaries, so that builds made meanwhile do
# not replace them: first
#   cargo test --release --test kill9 --no-run   # prints the test binary's path
#   mkdir -p /tmp/k9 && cp target/release/ember /tmp/k9/ember && cp <that path> /tmp/k9/kill9
# (assert_cmd finds the ember binary through CARGO_BIN_EXE_ember). Output: loop.log.
cd /work/main
for c in 1 2; do ( while :; do :; done ) & done
busy=$(jobs -p)
lscpu | grep "Model name"
for i in $(seq 1 20); do
  s=$SECONDS
  CARGO_BIN_EXE_ember=/tmp/k9/ember /tmp/k9/kill9 > /tmp/k9/run-$i.log 2>&1
  rc=$?
  echo "run $i: exit $rc, $((SECONDS - s)) s, $(grep -h 'kills of a resume' /tmp/k9/run-$i.log) $(grep -h 'test result' /tmp/k9/run-$i.log)"
  [ $rc -eq 0 ] || break
done
kill $busy
uptime
