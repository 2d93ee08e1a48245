#!/usr/bin/env bash
# The README's second command: runs the test suite (suites unit, kernels and mpi; 'slow' is left out
# unless asked: scripts/test.sh --setup all), as many tests at a time as there are cores
# (tests/meson.build), and prints one closing count line.
set -uo pipefail
cd "$(dirname "$0")/.."
meson test -C build --print-errorlogs "$@"
status=$?
python3 - "$(ls -t build/meson-logs/testlog*.json | head -n 1)" <<'PY'
import json, sys
counts = {}
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    counts[r] = counts.get(r, 0) + 1
failed = sum(v for k, v in counts.items() if k not in ("OK", "SKIP", "EXPECTEDFAIL"))
print(f"tests: {counts.get('OK', 0)} passed, {failed} failed, {counts.get('SKIP', 0)} skipped")
PY
exit $status
