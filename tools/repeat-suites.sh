#!/usr/bin/env bash
# Runs test suites over and over on a clone of this checkout's HEAD, one run after another, and keeps a tally: the
# proof that a suite does not fail now and then (docs/testing.md, "Repeated runs"). The clone keeps the code under
# test fixed while the checkout changes. Several streams may run side by side (each starts its own control planes on
# free ports); the suites mostly wait on their API servers and fault timers.
#
# usage: tools/repeat-suites.sh NAME COUNT [PYTEST_ARGS...]
#   NAME     the stream's folder, build/repeat/NAME (clone, one log and JUnit report a run, tally)
#   COUNT    how many runs at most; touching build/repeat/STOP ends the stream before its next run
#   default PYTEST_ARGS: tests/binder/e2e tests/binder/faults
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 2 ] || { sed -n '7,10p' "$0"; exit 2; }
name=$1; count=$2; shift 2
[ $# -gt 0 ] || set -- tests/binder/e2e tests/binder/faults
top=$PWD/build/repeat
out=$top/$name
rm -rf "$out"; mkdir -p "$out"
git clone -q "$PWD" "$out/clone"
cd "$out/clone"
echo "commit $(git rev-parse --short HEAD): $*" > "$out/tally"
failed=0
for i in $(seq 1 "$count"); do
  [ -e "$top/STOP" ] && { echo "stopped before run $i" >> "$out/tally"; break; }
  start=$(date +%s)
  PYTHONPATH="$out/clone" python3 -m pytest -q -p no:cacheprovider "$@" --junitxml="$out/run$i.xml" \
    --durations=15 > "$out/run$i.log" 2>&1
  rc=$?
  end=$(date +%s)
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  echo "run $i rc=$rc $((end - start)) s $(date -u -d "@$start" +%H:%M:%S)-$(date -u -d "@$end" +%H:%M:%S)" \
    "$(tail -1 "$out/run$i.log")" >> "$out/tally"
done
echo "stream done: $failed failed" >> "$out/tally"
cat "$out/tally"
[ "$failed" -eq 0 ]
