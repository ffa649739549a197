#!/bin/bash
# 20 consecutive runs of tests/kill9.rs beside two busy loops (stress -c 2's load).
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
