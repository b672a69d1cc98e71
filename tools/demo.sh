#!/usr/bin/env bash
# Sets up, builds zuvrs (release) and runs the quick comparison of zuvrs with
# the stdlib loop, uvloop and rloop: every workload in fresh processes,
# interleaved, ending with a table of throughput and speed-ups.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh release
.venv/bin/python benchmarks/compare.py --quick "$@"
