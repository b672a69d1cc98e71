"""python -m zuvrs: a program run under it sees what it would see under
plain `python` (sys.argv, sys.path[0], __name__, __file__, __spec__, exit
codes, errors), except that its asyncio loops are zuvrs loops. Each case
runs the same program both ways and compares.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """\
    import asyncio, json, os, sys

    async def main():
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    main_module = sys.modules["__main__"]
    spec = globals().get("__spec__")
    print(json.dumps({
        "argv": sys.argv,
        "path0": sys.path[0],
        "name": __name__,
        "file": globals().get("__file__"),
        "spec": spec.name if spec is not None else None,
        "main_is_me": main_module.__dict__ is globals(),
        "loop": asyncio.run(main()),
        "policy_loop": type(asyncio.new_event_loop()).__module__.split(".")[0],
    }))
    sys.stdout.flush()
    code = int(os.environ.get("PROBE_EXIT", "0"))
    if os.environ.get("PROBE_RAISE"):
        raise ValueError("probe failed on purpose")
    sys.exit(code)
    """
)


def _run(args, cwd, **env):
    full_env = dict(os.environ)
    full_env.pop("PYTHONPATH", None)
    full_env.pop("PYTHONSAFEPATH", None)
    full_env.update(env)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120
    )


def _report(out):
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stdout + out.stderr
    return json.loads(lines[-1])


def _compare(plain_args, zuvrs_args, cwd, **env):
    plain = _run(plain_args, cwd, **env)
    under = _run(["-m", "zuvrs", *zuvrs_args], cwd, **env)
    a, b = _report(plain), _report(under)
    assert a.pop("loop") == "asyncio" and a.pop("policy_loop") == "asyncio"
    assert b.pop("loop") == "zuvrs" and b.pop("policy_loop") == "zuvrs"
    assert a == b
    assert plain.returncode == under.returncode
    return a, plain, under


@pytest.fixture
def project(tmp_path):
    (tmp_path / "app.py").write_text(PROBE)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(PROBE)
    (pkg / "__main__.py").write_text(PROBE)
    appdir = tmp_path / "appdir"
    appdir.mkdir()
    (appdir / "__main__.py").write_text(PROBE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return tmp_path


def test_script(project):
    report, _, _ = _compare(["app.py", "a", "--b", "-m"], ["app.py", "a", "--b", "-m"], project)
    assert report["argv"] == ["app.py", "a", "--b", "-m"]
    assert report["name"] == "__main__" and report["main_is_me"]
    assert report["path0"] == str(project)


def test_script_by_absolute_path_from_elsewhere(project):
    script = str(project / "app.py")
    report, _, _ = _compare([script, "x"], [script, "x"], project / "elsewhere")
    assert report["argv"] == [script, "x"]
    assert report["path0"] == str(project)


def test_script_after_double_dash(project):
    plain = _report(_run(["app.py", "-c"], project))
    under = _report(_run(["-m", "zuvrs", "--", "app.py", "-c"], project))
    assert under["loop"] == "zuvrs"
    assert under["argv"] == plain["argv"] == ["app.py", "-c"]


def test_directory_with_main(project):
    report, _, _ = _compare(["appdir", "z"], ["appdir", "z"], project)
    assert report["argv"] == ["appdir", "z"]


def test_module(project):
    report, _, _ = _compare(["-m", "pkg.tool", "1", "-v"], ["-m", "pkg.tool", "1", "-v"], project)
    assert report["argv"] == [str(project / "pkg" / "tool.py"), "1", "-v"]
    assert report["spec"] == "pkg.tool" and report["name"] == "__main__" and report["main_is_me"]


def test_package_main(project):
    report, _, _ = _compare(["-m", "pkg"], ["-m", "pkg"], project)
    assert report["spec"] == "pkg.__main__"


def test_module_joined_form(project):
    plain = _report(_run(["-mpkg.tool", "q"], project))
    under = _report(_run(["-m", "zuvrs", "-mpkg.tool", "q"], project))
    assert under["loop"] == "zuvrs" and under["argv"] == plain["argv"]


def test_code(project):
    report, _, _ = _compare(["-c", PROBE, "p", "q"], ["-c", PROBE, "p", "q"], project)
    assert report["argv"] == ["-c", "p", "q"]
    assert report["path0"] == "" and report["name"] == "__main__" and report["file"] is None


def test_exit_code(project):
    _, plain, under = _compare(["app.py"], ["app.py"], project, PROBE_EXIT="7")
    assert plain.returncode == under.returncode == 7


def test_uncaught_exception(project):
    _, plain, under = _compare(["app.py"], ["app.py"], project, PROBE_RAISE="1")
    assert plain.returncode == under.returncode == 1
    for out in (plain, under):
        assert out.stderr.strip().splitlines()[-1] == "ValueError: probe failed on purpose"
        assert 'app.py", line' in out.stderr


def test_missing_script(project):
    plain = _run(["missing.py"], project)
    under = _run(["-m", "zuvrs", "missing.py"], project)
    assert plain.returncode == under.returncode == 2
    assert under.stderr == plain.stderr


def test_missing_module(project):
    plain = _run(["-m", "no_such_module_here"], project)
    under = _run(["-m", "zuvrs", "-m", "no_such_module_here"], project)
    assert plain.returncode == under.returncode == 1
    assert "No module named no_such_module_here" in under.stderr
    def last_message(stderr):
        return stderr.strip().splitlines()[-1].split(": ", 1)[1]

    assert last_message(plain.stderr) == last_message(under.stderr)


def test_version(project):
    import zuvrs

    out = _run(["-m", "zuvrs", "--version"], project)
    assert out.returncode == 0
    assert out.stdout == f"zuvrs {zuvrs.__version__}\n"


def test_info(project):
    import platform
    import ssl

    import zuvrs
    from zuvrs import _zuvrs

    out = _run(["-m", "zuvrs", "--info"], project)
    assert out.returncode == 0, out.stderr
    rows = dict(line.split(":", 1) for line in out.stdout.splitlines())
    rows = {k: v.strip() for k, v in rows.items()}
    assert rows["zuvrs"] == zuvrs.__version__
    assert rows["libuv"] == ".".join(map(str, zuvrs.libuv_version()))
    assert rows["OpenSSL"] == ssl.OPENSSL_VERSION
    assert rows["Python"].startswith(f"{platform.python_version()} ({platform.python_implementation()}")
    assert rows["build profile"] == _zuvrs.BUILD_PROFILE in ("release", "debug")
    assert rows["context sharing"] == _zuvrs.CONTEXT_SHARING in ("read", "copy", "off")
    assert rows["platform"] == platform.platform()
    assert rows["executable"] == sys.executable


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "usage: python -m zuvrs"),
        (["--bogus"], "unknown option --bogus"),
        (["-m"], "argument expected for the -m option"),
        (["-c"], "argument expected for the -c option"),
        (["--"], "a script is needed after --"),
    ],
)
def test_usage_errors(project, args, message):
    out = _run(["-m", "zuvrs", *args], project)
    assert out.returncode == 2
    assert message in out.stderr


def test_help(project):
    out = _run(["-m", "zuvrs", "--help"], project)
    assert out.returncode == 0
    assert out.stdout.startswith("usage: python -m zuvrs")
