#!/bin/bash
# Run one `moesd sweep ...` only while no other process uses the CPU: on a shared machine, other work
# inflates single timed passes. Waits until no other process has taken more than LIMIT % of a core for
# QUIET seconds, starts the sweep, and stops it (SIGTERM: every finished point is kept, the point in flight
# is lost; a background job of a script ignores SIGINT) as soon as another process takes more than LIMIT %
# in two samples in a row; then waits for quiet again and resumes (the sweep continues from its complete
# rows). Each start and stop is logged to stderr with the process seen.
#
#   flock /tmp/moesd-cpu.lock tools/quiet_sweep.sh .venv/bin/moesd sweep forward --preset cpu --out-dir runs/x
LIMIT=${LIMIT:-40}
QUIET=${QUIET:-30}
others() {  # the busiest other process over a 2-second sample, if above LIMIT % (pid %cpu command)
  top -b -n 2 -d 2 -o %CPU | awk -v limit="$LIMIT" -v skip="$1" '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $1 != skip \
    && $9+0 > limit {print $1, $9, $12; exit}'
}
while true; do
  quiet=0
  while [ "$quiet" -lt "$QUIET" ]; do
    if [ -n "$(others 0)" ]; then quiet=0; else quiet=$((quiet + 2)); fi
  done
  echo "$(date -u +%FT%TZ) start, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$@" &
  sweep=$!
  strikes=0
  while kill -0 "$sweep" 2>/dev/null; do
    busy=$(others "$sweep")
    if [ -n "$busy" ]; then strikes=$((strikes + 1)); else strikes=0; fi
    if [ "$strikes" -ge 2 ]; then
      echo "$(date -u +%FT%TZ) stopped: another process took the CPU ($busy)" >&2
      kill -TERM "$sweep"; wait "$sweep" 2>/dev/null
      continue 2
    fi
  done
  wait "$sweep"
  status=$?
  echo "$(date -u +%FT%TZ) finished with exit $status, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  exit "$status"
done
