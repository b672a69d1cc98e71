"""zuvrs.pytest_plugin on a small project's async test suite
(tests/plugin_sample: pytest-asyncio with several loop scopes, AnyIO's
plugin, IsolatedAsyncioTestCase and asyncio.run, pytest-aiohttp, and
aiohttp's own plugin), run in a fresh pytest process with the plugin (every
test must see a zuvrs loop), with --no-zuvrs and without the plugin (every
test must see asyncio's loop).
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pytest_asyncio")
pytest.importorskip("anyio")
pytest.importorskip("aiohttp")
pytest.importorskip("pytest_aiohttp")

SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_sample")

# pytest-asyncio, AnyIO, unittest and pytest-aiohttp sample files
MAIN_FILES = [
    "sample_pytest_asyncio.py", "sample_anyio.py", "sample_unittest.py", "sample_pytest_aiohttp.py",
]
MAIN_COUNT = 7 + 2 + 3 + 1
# aiohttp's own plugin instead of pytest-aiohttp (the two do not mix)
LEGACY = ["-p", "no:aiohttp", "-p", "no:asyncio", "-p", "aiohttp.pytest_plugin", "sample_aiohttp_legacy.py"]
LEGACY_COUNT = 2


@pytest.fixture
def project(tmp_path):
    dest = tmp_path / "project"
    shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def run_pytest(project, args, expect):
    env = dict(os.environ)
    env["SAMPLE_EXPECT"] = expect
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_PLUGINS", None)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-rA", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    return out


def passed(out, count):
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    summary = text.strip().splitlines()[-1]
    assert re.search(rf"\b{count} passed\b", summary), text
    assert not re.search(r"failed|error|skipped", summary), text
    return text


def test_sample_on_zuvrs(project):
    text = passed(run_pytest(project, ["-p", "zuvrs.pytest_plugin", *MAIN_FILES], "zuvrs"), MAIN_COUNT)
    assert re.search(r"^zuvrs: \S+ \(libuv [\d.]+\), async tests run on zuvrs loops$", text, re.M), text


def test_sample_with_no_zuvrs(project):
    text = passed(
        run_pytest(project, ["-p", "zuvrs.pytest_plugin", "--no-zuvrs", *MAIN_FILES], "asyncio"), MAIN_COUNT
    )
    assert "disabled by --no-zuvrs" in text


def test_sample_without_plugin(project):
    passed(run_pytest(project, MAIN_FILES, "asyncio"), MAIN_COUNT)


def test_aiohttp_plugin_on_zuvrs(project):
    passed(run_pytest(project, ["-p", "zuvrs.pytest_plugin", *LEGACY], "zuvrs"), LEGACY_COUNT)


def test_aiohttp_plugin_without_zuvrs(project):
    passed(run_pytest(project, LEGACY, "asyncio"), LEGACY_COUNT)


def test_plugin_from_conftest(project):
    (project / "conftest.py").write_text('pytest_plugins = ["zuvrs.pytest_plugin"]\n')
    passed(run_pytest(project, MAIN_FILES, "zuvrs"), MAIN_COUNT)


def test_plugin_from_addopts(project):
    ini = project / "pytest.ini"
    with_plugin = "addopts = -p no:cacheprovider -p zuvrs.pytest_plugin"
    ini.write_text(ini.read_text().replace("addopts = -p no:cacheprovider", with_plugin))
    passed(run_pytest(project, MAIN_FILES, "zuvrs"), MAIN_COUNT)


def test_policy_restored_after_session(project):
    # pytest.main() in a process that had its own policy: the plugin puts it
    # back when the session ends.
    code = textwrap.dedent(
        """\
        import asyncio, sys, warnings
        import pytest
        warnings.simplefilter("ignore", DeprecationWarning)

        class Mine(asyncio.DefaultEventLoopPolicy):
            pass

        mine = Mine()
        asyncio.set_event_loop_policy(mine)
        code = pytest.main(["-q", "-p", "zuvrs.pytest_plugin", "sample_unittest.py"])
        assert code == 0, code
        assert asyncio.get_event_loop_policy() is mine
        print("restored")
        """
    )
    env = dict(os.environ, SAMPLE_EXPECT="zuvrs")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("restored"), out.stdout


def test_zuvrs_loop_factory_fixture(project):
    (project / "sample_factory.py").write_text(textwrap.dedent(
        """\
        import asyncio
        from expect import check_loop

        def test_factory(zuvrs_loop_factory):
            loop = zuvrs_loop_factory()
            try:
                check_loop(loop)
            finally:
                loop.close()
        """
    ))
    passed(run_pytest(project, ["-p", "zuvrs.pytest_plugin", "sample_factory.py"], "zuvrs"), 1)
    passed(run_pytest(project, ["-p", "zuvrs.pytest_plugin", "--no-zuvrs", "sample_factory.py"], "asyncio"), 1)
