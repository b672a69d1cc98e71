#!/usr/bin/env bash
# The long run of the differential transport fuzzer (tests/test_fuzz_transports.py):
# hypothesis programs of transport operations (writes, writelines,
# pause/resume_reading, write buffer limits, write_eof, close, abort, resets;
# for TLS also a hand-driven peer sending its records in random slices,
# close_notify, a bare EOF) run on asyncio's loop and on zuvrs over TCP, Unix
# sockets, pipes, TLS and TCP upgraded by start_tls (TCP, Unix and start_tls
# ends also as BufferedProtocols), their observations compared. Every transport gets
# ZUVRS_FUZZ_EXAMPLES programs (default 2000; measured per program on both
# loops together: TCP, Unix and pipes 0.15 s, TLS 0.2 s, TLS against the
# hand-driven peer 0.7 s, so 2000 per transport is about 45 minutes on a
# 2-core machine, one transport after the other) drawn at random unless
# ZUVRS_FUZZ_SEED is an int. Prints how many programs and steps each transport ran and how
# long it took; a difference fails with the shrunk program and the two
# observations side by side.
#
# Usage: tools/fuzz.sh [pytest -k expression, e.g. "tcp or pipe"]
set -euo pipefail
cd "$(dirname "$0")/.."
export ZUVRS_FUZZ_EXAMPLES="${ZUVRS_FUZZ_EXAMPLES:-2000}"
export ZUVRS_FUZZ_SEED="${ZUVRS_FUZZ_SEED:-random}"
args=(-q -s -p no:cacheprovider -o faulthandler_timeout=14400 tests/test_fuzz_transports.py)
[ $# -gt 0 ] && args+=(-k "$1")
echo "== fuzzing: $ZUVRS_FUZZ_EXAMPLES programs per transport, seed $ZUVRS_FUZZ_SEED"
start=$(date +%s)
status=0
.venv/bin/python -m pytest "${args[@]}" || status=$?
echo "== fuzzing took $(( $(date +%s) - start )) s"
exit $status
