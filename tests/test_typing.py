"""The type stubs (python/zuvrs/__init__.pyi) under mypy --strict.

Code that uses the public API, EventLoopPolicy included (up to 3.13 its
base class has abstract child-watcher methods: the stub must define them),
type-checks cleanly for every Python zuvrs supports.
"""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy")

SAMPLE = textwrap.dedent(
    """\
    import asyncio
    import sys

    import zuvrs


    async def main() -> int:
        await asyncio.sleep(0)
        return 42


    policy = zuvrs.EventLoopPolicy()
    loop: zuvrs.Loop = policy.new_event_loop()
    handle: zuvrs.Handle = loop.call_soon(print, "soon")
    handle.cancel()
    timer: zuvrs.TimerHandle = loop.call_later(0.1, print, "late")
    when: float = timer.when()
    timer.cancel()
    loop.close()
    if sys.version_info < (3, 14):
        watcher = policy.get_child_watcher()
        watcher.attach_loop(None)
        policy.set_child_watcher(None)
    zuvrs.install()
    result: int = zuvrs.run(main())
    major, minor, patch = zuvrs.libuv_version()
    version: str = zuvrs.__version__
    if sys.version_info >= (3, 12):
        asyncio.run(main(), loop_factory=zuvrs.new_event_loop)
    """
)

# The same sample with a mistake mypy must report (the stubs are in use).
BROKEN = SAMPLE + "wrong: str = zuvrs.run(main())\n"


def _mypy(tmp_path, source, python_version):
    path = tmp_path / "sample.py"
    path.write_text(source)
    return subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--no-incremental",
            "--python-version", python_version,
            "--cache-dir", str(tmp_path / "cache"), str(path),
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )


@pytest.mark.parametrize("python_version", ["3.10", "3.11", "3.12", "3.13", "3.14"])
def test_mypy_strict_accepts_public_api(tmp_path, python_version):
    result = _mypy(tmp_path, SAMPLE, python_version)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_mypy_strict_sees_the_stubs(tmp_path):
    result = _mypy(tmp_path, BROKEN, "3.12")
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Incompatible types in assignment (expression has type "int", variable has type "str")' in result.stdout
