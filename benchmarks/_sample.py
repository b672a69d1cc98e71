"""One benchmark sample in this (fresh) process; used by compare.py.

    python3 benchmarks/_sample.py --loop uvloop --workload call_soon --size 1000000
    python3 benchmarks/_sample.py --probe zuvrs
    python3 benchmarks/_sample.py --probe-env

Prints exactly one line starting with MARKER followed by JSON, on stdout.
Sample: elapsed seconds (loop creation to loop close, parity checks
excluded), ops, parity, expected, ok, peak RSS (ru_maxrss) before and after
the workload, GC state. Probe: whether the loop imports, its version, where
it was loaded from and any build information it exposes.
Exit status: 0 if the sample ran and its parity matched, 3 on a parity
mismatch, 2 if the loop is unavailable, 4 if the loop does not support what
the workload needs (workloads.Unsupported), 1 on an exception.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import traceback

MARKER = "@@ZUVRS-BENCH@@ "

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # Linux: KiB


def _emit(obj: dict) -> None:
    sys.stdout.flush()
    sys.stdout.write(MARKER + json.dumps(obj, default=repr) + "\n")
    sys.stdout.flush()


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


_CALL_FOR_INFO = ("build_info", "_build_info", "get_build_info",
                  "libuv_version")


def _build_info(mod) -> dict:
    """Whatever build/commit information a module exposes (tolerates none):
    attributes named like *build*, *profile*, *debug*, *commit*, *git*,
    *version*, *features*, *sharing* of the package and its extension
    submodules."""
    info = {}
    seen = set()
    mods = [mod]
    for sub in dir(mod):
        m = getattr(mod, sub, None)
        if (type(m) is type(mod) and m is not mod
                and getattr(m, "__name__", "").startswith(mod.__name__ + ".")):
            mods.append(m)
    for m in mods:
        for attr in dir(m):
            low = attr.lower()
            if not any(k in low for k in ("build", "profile", "debug", "commit",
                                          "git", "version", "features", "sharing")):
                continue
            try:
                v = getattr(m, attr)
            except Exception:
                continue
            if type(v) is type(mod) or id(v) in seen:
                continue
            seen.add(id(v))
            if callable(v):
                if low not in _CALL_FOR_INFO:
                    continue
                try:
                    v = v()
                except Exception as exc:
                    v = f"error: {exc!r}"
            info[f"{m.__name__}.{attr}"] = _jsonable(v)
    return info


def _extensions(mod) -> list:
    """Path, size and mtime of the package's compiled extension modules."""
    exts = []
    pkg_dir = os.path.dirname(getattr(mod, "__file__", None) or "")
    if pkg_dir and os.path.isdir(pkg_dir):
        for f in sorted(os.listdir(pkg_dir)):
            if f.endswith((".so", ".pyd", ".dylib")):
                p = os.path.join(pkg_dir, f)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                exts.append({
                    "file": p, "bytes": st.st_size,
                    "mtime": time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                           time.localtime(st.st_mtime)),
                })
    return exts


def probe(name: str) -> int:
    out = {"loop": name, "available": False}
    try:
        workloads.get_loop_factory(name)
    except workloads.LoopUnavailable as exc:
        out["error"] = str(exc)
        _emit(out)
        return 2
    out["available"] = True
    modname = workloads._LOOP_MODULES[name][0]
    mod = sys.modules[modname]
    out["version"] = getattr(mod, "__version__", None)
    if name == "asyncio":
        out["version"] = "stdlib " + sys.version.split()[0]
    else:
        try:
            from importlib import metadata
            out["dist_version"] = metadata.version(modname)
        except Exception:
            pass
    out["file"] = getattr(mod, "__file__", None)
    out["build"] = _build_info(mod) if name != "asyncio" else {}
    # extension modules: path, size and mtime say which build this is
    exts = _extensions(mod) if name != "asyncio" else []
    out["extensions"] = exts
    _emit(out)
    return 0


def _openssl_version() -> str | None:
    try:
        import ssl
    except ImportError:
        return None
    return ssl.OPENSSL_VERSION


def probe_env() -> int:
    """The interpreter and process settings that samples will run with."""
    import platform
    import sysconfig
    out = {
        "executable": sys.executable,
        "version": sys.version,
        "implementation": platform.python_implementation(),
        "build": list(platform.python_build()),
        "compiler": platform.python_compiler(),
        "debug_build": hasattr(sys, "gettotalrefcount"),
        "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": (sys._is_gil_enabled()
                        if hasattr(sys, "_is_gil_enabled") else True),
        "config_args": sysconfig.get_config_var("CONFIG_ARGS"),
        "dev_mode": sys.flags.dev_mode,
        "optimize": sys.flags.optimize,
        "gc_enabled": gc.isenabled(),
        "gc_threshold": list(gc.get_threshold()),
        "switch_interval": sys.getswitchinterval(),
        "openssl": _openssl_version(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith("PYTHON") and k not in ("PYTHONPATH",)},
    }
    jit = getattr(sys, "_jit", None)
    if jit is not None:
        try:
            out["jit_enabled"] = jit.is_enabled()
        except Exception:
            pass
    _emit(out)
    return 0


class _GcTimer:
    """Time the cyclic GC's pauses per generation with ``gc.callbacks``
    (a Python call on each collection's start and stop, nothing else)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._t0


def sample(name: str, workload: str, size: int, no_gc: bool,
           cpus: str | None, gc_time: bool = False) -> int:
    out = {"loop": name, "workload": workload, "size": size, "pid": os.getpid()}
    if cpus:
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except Exception as exc:
            out["affinity_error"] = repr(exc)
    try:
        out["affinity"] = sorted(os.sched_getaffinity(0))
    except Exception:
        out["affinity"] = None
    try:
        factory = workloads.get_loop_factory(name)
    except workloads.LoopUnavailable as exc:
        out.update(ok=False, error_kind="unavailable", error=str(exc))
        _emit(out)
        return 2
    if no_gc:
        gc.disable()
    out["gc_enabled"] = gc.isenabled()
    out["gc_threshold"] = list(gc.get_threshold())
    if name != "asyncio":
        # which build of the loop this sample ran (compare.py checks that
        # it did not change during a run)
        mod = sys.modules.get(workloads._LOOP_MODULES[name][0])
        out["build_id"] = ";".join(
            f"{os.path.basename(e['file'])}:{e['bytes']}:{e['mtime']}"
            for e in _extensions(mod)) if mod is not None else None
        # and its build profile, if exposed (a debug build installed in the
        # middle of a run must not pass for a release one)
        if mod is not None:
            for k, v in _build_info(mod).items():
                if "profile" in k.lower() and isinstance(v, str):
                    out["build_profile"] = v
                    break
    out["rss_start"] = _maxrss_bytes()
    collections_before = [st.get("collections") for st in gc.get_stats()]
    timer = _GcTimer() if gc_time else None
    if timer is not None:
        gc.callbacks.append(timer)
    try:
        res = workloads.run_workload(workload, factory, size)
    except workloads.Unsupported as exc:
        out.update(ok=False, error_kind="unsupported",
                   error=f"unsupported: {exc}"[:500],
                   rss_peak=_maxrss_bytes())
        _emit(out)
        return 4
    except BaseException as exc:
        out.update(ok=False, error_kind="exception",
                   error=f"{type(exc).__name__}: {exc}"[:500],
                   traceback=traceback.format_exc()[-3000:],
                   rss_peak=_maxrss_bytes())
        _emit(out)
        return 1
    out["rss_peak"] = _maxrss_bytes()
    out["gc_collections"] = [s.get("collections") for s in gc.get_stats()]
    if timer is not None:
        gc.callbacks.remove(timer)
        out["gc_seconds"] = timer.seconds
        out["gc_collections_during"] = [a - b for a, b in
                                        zip(out["gc_collections"], collections_before)]
    out.update(_jsonable(res))
    if not res["ok"]:
        out["error_kind"] = "parity"
        got, exp = res["parity"], res["expected"]
        diff = [f"{k} {got.get(k)!r} (expected {exp.get(k)!r})"
                for k in sorted(set(got) | set(exp)) if got.get(k) != exp.get(k)]
        out["error"] = ("parity mismatch: " + ", ".join(diff) if diff else
                        f"parity as expected ({got}) but the loop reported errors")
        if res.get("loop_errors"):
            out["error"] += f"; loop errors: {res['loop_errors']}"
        guard = (res.get("info") or {}).get("guard")
        timeouts = (res.get("info") or {}).get("timeouts")
        if guard:
            out["error"] += f"; {guard}"
        if timeouts:
            out["error"] += f"; {'; '.join(timeouts)}"
        why = (res.get("info") or {}).get("close_not_done") or (
            res.get("info") or {}).get("streams_not_as_claimed")
        if why:
            out["error"] += f"; {why}"
        _emit(out)
        return 3
    _emit(out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", metavar="LOOP")
    ap.add_argument("--probe-env", action="store_true")
    ap.add_argument("--loop")
    ap.add_argument("--workload", choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--size", type=int)
    ap.add_argument("--no-gc", action="store_true",
                    help="diagnostic only: disable the cyclic GC")
    ap.add_argument("--gc-time", action="store_true",
                    help="diagnostic: time the GC's pauses (gc.callbacks)")
    ap.add_argument("--cpus", help="pin this process to these CPUs, e.g. 0 or 0,1")
    ap.add_argument("--no-prelude", action="store_true",
                    help="diagnostic only: skip the untimed connection that "
                         "network workloads make first (workloads._prelude)")
    a = ap.parse_args(argv)
    if a.probe_env:
        return probe_env()
    if a.probe:
        return probe(a.probe)
    if not (a.loop and a.workload):
        ap.error("--loop and --workload are required (or --probe)")
    size = a.size if a.size is not None else workloads.WORKLOADS[a.workload][1]
    if a.no_prelude:
        workloads.NETWORK_PRELUDE = False
    return sample(a.loop, a.workload, size, a.no_gc, a.cpus, a.gc_time)


if __name__ == "__main__":
    sys.exit(main())
