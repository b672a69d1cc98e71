#!/usr/bin/env bash
# Runs the test suite on a sanitized build of zuvrs. Not part of
# tools/test.sh: it needs the nightly toolchain and takes much longer.
#
#   tools/sanitize.sh address   [PYTEST_ARGS...]   # AddressSanitizer
#   tools/sanitize.sh undefined [PYTEST_ARGS...]   # UBSan on libuv, rustc's UB checks on Rust
#
# address: the extension is built with the nightly toolchain and
#   `-Zsanitizer=address` (Rust) and `-fsanitize=address` (libuv, through
#   the cc crate's CFLAGS), release settings but opt-level 1, no LTO and
#   line tables, in target/sanitize-address, and installed into its own
#   virtualenv, .venv-asan. The interpreter is not instrumented, so the
#   runtime is preloaded into it (LD_PRELOAD of GCC's shared libasan, whose
#   interface is a superset of what rustc's LLVM emits; checked after the
#   build) and PYTHONMALLOC=malloc routes every Python allocation through
#   it, so objects get redzones and a quarantine. Leak detection is off: the
#   interpreter does not free what it allocates once per process, and since
#   every allocation zuvrs makes has interpreter frames below it, no
#   suppression could tell the interpreter's apart from zuvrs's (zuvrs's
#   leaks are what tests/test_leaks.py and test_tls_leaks.py count).
# undefined: Rust has no UndefinedBehaviorSanitizer; this mode builds libuv
#   with GCC's `-fsanitize=undefined` (runtime libubsan preloaded) and the
#   Rust code with `-Zub-checks=yes` (the standard library's checks of unsafe
#   preconditions and the compiler's misaligned and null dereference checks,
#   which otherwise only the debug build has) at release settings, in
#   target/sanitize-undefined and .venv-ubsan.
#
# Error policy. AddressSanitizer stops a process at its first report
# (halt_on_error=1, exit code 86): after an invalid access the heap is no
# longer trustworthy, and continuing would need every crate built with
# -Zsanitizer-recover. So that one report does not end the run, every test
# file runs in its own interpreter; a report costs the rest of that file
# only. UBSan reports are recoverable and do not corrupt anything, so that
# mode keeps going and collects them all. Reports go to files (log_path)
# in target/sanitize-MODE/reports-TIME/, one per reporting process (child
# processes inherit the preload, so a report from a child Python or a
# server the tests start lands there too), with every file's pytest output
# beside them; the summary at the end lists them.
#
# Arguments: none runs every tests/test_*.py, one interpreter each; if every
# argument is a test file, each runs in its own interpreter; anything else
# (node ids, -k, options) is passed to a single pytest run. `--upstream
# [RUN_PY_ARGS...]` runs the upstream suites' CI selection instead
# (tools/upstream.sh --ci; its children keep the sanitizer's environment,
# and its counts are checked against the ratchet as in CI). Environment:
# ZUVRS_SANITIZE_TIMEOUT (seconds per interpreter, default 1800); extra
# ASAN_OPTIONS / UBSAN_OPTIONS are appended to the script's (later options
# win), e.g. ASAN_OPTIONS=fast_unwind_on_malloc=0 for complete allocation
# and free stacks (much slower). PYTHON picks the base interpreter
# (default python3).
#
# Needs: rustup's nightly toolchain (no rust-src: the standard library stays
# uninstrumented), gcc with libasan / libubsan, libclang (bindgen, as
# tools/setup.sh installs), llvm-symbolizer for symbolized reports (Debian's
# llvm package; without it GCC's runtime symbolizes by itself, less well),
# and the network or pip's cache for the venv. Before the suite, a
# self-check (tools/sanitizers/probe) makes sure an invalid access in Rust
# and in C built the same way is reported. Time on a 2-core machine: the
# first build about 3 minutes (seconds after), the whole suite about 10
# minutes under ASan and 5 under UBSan, --upstream about 10
# (docs/sanitizers.md has the figures and what each run found).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode="${1:-}"
upstream=0
[ "${2:-}" = --upstream ] && upstream=1
case "$mode" in
    address) venv=.venv-asan; runtime_name=libasan.so ;;
    undefined) venv=.venv-ubsan; runtime_name=libubsan.so ;;
    *)
        echo "usage: tools/sanitize.sh address|undefined [PYTEST_ARGS...]" >&2
        exit 2
        ;;
esac
shift
[ $upstream = 1 ] && shift

target=x86_64-unknown-linux-gnu
if [ "$(uname -m)-$(uname -s)" != "x86_64-Linux" ]; then
    echo "tools/sanitize.sh supports x86_64 Linux only" >&2
    exit 2
fi
if ! rustc +nightly --version >/dev/null 2>&1; then
    echo "the nightly toolchain is missing (rustup toolchain install nightly)" >&2
    exit 2
fi
runtime=$(readlink -f "$(gcc -print-file-name="$runtime_name")")
if [ ! -f "$runtime" ]; then
    echo "gcc has no $runtime_name (Debian: libasan8 / libubsan1)" >&2
    exit 2
fi
symbolizer=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | tail -1 || true)

stamp=$(date -u +%Y%m%d-%H%M%S)
target_dir=$root/target/sanitize-$mode
reports=$target_dir/reports-$stamp
mkdir -p "$reports"
t0=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
echo "== installing Python packages into $venv"
# tools/setup.sh's list, without the linters and the benchmarks' redis.
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "maturin>=1.5,<2" "pytest>=7" "pytest-codspeed>=3" uvloop rloop \
    uvicorn httptools httpx aiohttp websockets cryptography \
    gunicorn uvicorn-worker hypercorn pytest-asyncio pytest-aiohttp anyio \
    mypy typing-extensions prometheus_client hypothesis

echo "== building zuvrs ($mode sanitizer, nightly, target/sanitize-$mode)"
# --target keeps RUSTFLAGS away from build scripts and proc macros (which
# would otherwise be instrumented and fail to link the runtime).
export RUSTUP_TOOLCHAIN=nightly
export CARGO_TARGET_DIR=$target_dir
export CARGO_PROFILE_RELEASE_LTO=off
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cflags_var=CFLAGS_${target//-/_}
if [ "$mode" = address ]; then
    rustflags="-Zsanitizer=address -Cforce-frame-pointers=yes"
    cflags="-fsanitize=address -fno-omit-frame-pointer -g"
else
    rustflags="-Zub-checks=yes -Cforce-frame-pointers=yes"
    cflags="-fsanitize=undefined -fno-omit-frame-pointer -g"
fi
export RUSTFLAGS=$rustflags
export "$cflags_var=$cflags"
wheels=$target_dir/wheels
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet --target "$target" --auditwheel skip \
    -i "$venv/bin/python" -o "$wheels"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/*.whl
unset RUSTUP_TOOLCHAIN CARGO_TARGET_DIR RUSTFLAGS "$cflags_var" CARGO_PROFILE_RELEASE_LTO \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS CARGO_PROFILE_RELEASE_OPT_LEVEL CARGO_PROFILE_RELEASE_DEBUG
t_built=$(date +%s)

# (Not imported to find it: without the preloaded runtime it does not load.)
ext=$("$venv/bin/python" -c 'import glob, sysconfig; print(*glob.glob(sysconfig.get_path("platlib") + "/zuvrs/_zuvrs*.so"))')
# Every sanitizer entry point the extension needs must be in the preloaded
# runtime: an old runtime that lacks one of a newer LLVM's would fail at
# the first call, not at load.
prefix=__asan_
[ "$mode" = undefined ] && prefix=__ubsan_
missing=$(comm -23 \
    <(nm -D --undefined-only "$ext" | awk '{print $2}' | grep "^$prefix" | sed 's/@.*//' | sort -u) \
    <(nm -D --defined-only "$runtime" | awk '{print $3}' | grep "^$prefix" | sed 's/@.*//' | sort -u))
if [ -n "$missing" ]; then
    echo "the runtime $runtime lacks what the extension calls:" >&2
    echo "$missing" >&2
    exit 2
fi
echo "   extension: $ext"
echo "   runtime:   $runtime ($(nm -D --undefined-only "$ext" | grep -c " U $prefix") entry points used)"

if [ "$mode" = address ]; then
    export PYTHONMALLOC=malloc
    export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:exitcode=86:detect_stack_use_after_return=1:\
allow_user_segv_handler=0:log_path=$reports/asan:log_exe_name=1:strip_path_prefix=$root/${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    [ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH=$symbolizer
else
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$reports/ubsan:log_exe_name=1:\
strip_path_prefix=$root/${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    [ -n "$symbolizer" ] && export UBSAN_SYMBOLIZER_PATH=$symbolizer
fi
timeout_s=${ZUVRS_SANITIZE_TIMEOUT:-1800}

# The self-check: an invalid access in Rust and one in C, built the way the
# extension is, must each be reported; otherwise a quiet run proves nothing.
echo "== self-check (tools/sanitizers/probe)"
probe_out=$reports/probe
mkdir -p "$probe_out"
RUSTUP_TOOLCHAIN=nightly CARGO_TARGET_DIR=$target_dir/probe RUSTFLAGS=$rustflags \
    cargo build --quiet --release --target "$target" --manifest-path tools/sanitizers/probe/Cargo.toml
probe_rs=$target_dir/probe/$target/release/libsanitizer_probe.so
probe_c=$target_dir/probe/probe_c.so
# shellcheck disable=SC2086  # $cflags is a list of flags
gcc -shared -fPIC -O1 $cflags -o "$probe_c" tools/sanitizers/probe/probe.c
if [ "$mode" = address ]; then
    probes=("$probe_rs probe_rust_heap_overflow 8 heap-buffer-overflow"
        "$probe_c probe_c_heap_overflow 8 heap-buffer-overflow")
else
    probes=("$probe_rs probe_rust_null_slice 1 unsafe.precondition"
        "$probe_c probe_c_signed_overflow 1 signed.integer.overflow")
fi
for probe in "${probes[@]}"; do
    read -r lib fn arg expect <<<"$probe"
    # The options as the suite gets them, but the reports go to the probe's directory.
    # (In a subshell whose stderr is dropped: the shell's own "Aborted" line
    # for the expected abort is not news.)
    (LD_PRELOAD=$runtime ASAN_OPTIONS="${ASAN_OPTIONS:-}:log_path=$probe_out/$fn" \
        UBSAN_OPTIONS="${UBSAN_OPTIONS:-}:log_path=$probe_out/$fn" \
        "$venv/bin/python" -c "import ctypes, sys; ctypes.CDLL(sys.argv[1]).$fn($arg)" "$lib" \
        >"$probe_out/$fn.out" 2>&1 || true) 2>/dev/null
    if cat "$probe_out/$fn".* "$probe_out/$fn.out" 2>/dev/null | grep -q -E "$expect"; then
        echo "   $fn: reported ($expect)"
    else
        echo "the $mode self-check failed: $fn was not reported (see ${probe_out#"$root"/})" >&2
        exit 2
    fi
done

# One interpreter per test file, or one for a selection that is not files.
runs=()
if [ $upstream = 1 ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/upstream/requirements.txt
    runs=(upstream)
elif [ $# -eq 0 ]; then
    runs=(tests/test_*.py)
else
    all_files=1
    for arg in "$@"; do
        case "$arg" in
            *.py) [ -f "$arg" ] || all_files=0 ;;
            *) all_files=0 ;;
        esac
    done
    if [ $all_files = 1 ]; then runs=("$@"); else runs=(""); fi
fi

echo "== tests under the $mode sanitizer (reports: ${reports#"$root"/})"
summary=$reports/summary.txt
: >"$summary"
for run in "${runs[@]}"; do
    if [ "$run" = upstream ]; then
        name=upstream
        args=(tests/upstream/run.py --ci --no-install "$@")
    elif [ -n "$run" ]; then
        name=$(basename "$run" .py)
        args=(-m pytest -q -p no:cacheprovider "$run")
    else
        name=selection
        args=(-m pytest -q -p no:cacheprovider "$@")
    fi
    t=$(date +%s)
    rc=0
    LD_PRELOAD="$runtime${LD_PRELOAD:+:$LD_PRELOAD}" timeout --kill-after=30 "$timeout_s" \
        "$venv/bin/python" "${args[@]}" >"$reports/$name.out" 2>&1 || rc=$?
    result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran|^ratchet:' "$reports/$name.out" \
        | tail -1 | sed 's/^=* //; s/ =*$//' || true)
    case $rc in
        86) note="stopped by a sanitizer report" ;;
        124|137) note="timed out after ${timeout_s}s" ;;
        134) note="aborted (see the .out file)" ;;
        *) note="" ;;
    esac
    line=$(printf '%-28s rc %-3s %5ss  %s%s' "$name" "$rc" "$(($(date +%s) - t))" "${result:-no result line}" \
        "${note:+  [$note]}")
    echo "   $line"
    echo "$line" >>"$summary"
done

echo "== summary ($mode; build $((t_built - t0))s, tests $(($(date +%s) - t_built))s)"
shopt -s nullglob
logs=("$reports"/asan.* "$reports"/ubsan.*)
echo "   ${#logs[@]} report file(s) in ${reports#"$root"/}"
for log in "${logs[@]}"; do
    echo "-- ${log#"$root"/}"
    # The kind of each report, and its first frames in zuvrs or libuv.
    grep -E '^SUMMARY:|: runtime error:' "$log" | sort | uniq -c | head -10 || true
    grep -E '^ +#[0-9]+ .* in .*(zuvrs|libuv|_zuvrs)' "$log" | head -3 || true
done | tee -a "$summary"
# Rust's own checks abort the process with a message instead of a report.
grep -l -E 'unsafe precondition|misaligned pointer dereference|null pointer dereference|panicked at' \
    "$reports"/*.out 2>/dev/null | sed "s|^$root/|   rust check or panic in: |" | tee -a "$summary" || true
echo "   (the summary is in ${summary#"$root"/})"
