"""A pytest plugin that runs a project's async tests on zuvrs loops.

    pytest -p zuvrs.pytest_plugin            # the whole run on zuvrs
    pytest -p zuvrs.pytest_plugin --no-zuvrs # the plugin loaded, stdlib loops (to compare)

or ``pytest_plugins = ["zuvrs.pytest_plugin"]`` in a top-level conftest.py,
or ``addopts = "-p zuvrs.pytest_plugin"`` in the pytest configuration.

For the session it installs ``zuvrs.EventLoopPolicy`` (and puts the previous
policy back at the end), which is how the test runners make their loops
when a project does not choose one:

* pytest-asyncio: its ``event_loop_policy`` fixture returns the current
  policy and its runners make their loops from it (so since 0.23; tested
  with 1.5; a project that overrides ``event_loop_policy`` or implements
  ``pytest_asyncio_loop_factories`` keeps its own choice);
* AnyIO's pytest plugin: ``anyio_backend = "asyncio"`` runs on
  ``asyncio.Runner`` without a loop factory, hence on the policy's loop
  (``("asyncio", {"loop_factory": ...})`` or ``use_uvloop`` keep theirs);
* aiohttp's plugins: pytest-aiohttp is built on pytest-asyncio;
  ``aiohttp.pytest_plugin``'s ``loop`` fixture with ``--aiohttp-loop=pyloop``
  (its default) calls ``asyncio.new_event_loop()``;
* ``unittest.IsolatedAsyncioTestCase`` and plain ``asyncio.run()`` /
  ``asyncio.new_event_loop()`` in tests use the policy.

The report header says which loop the run uses. The ``zuvrs_loop_factory``
fixture gives ``zuvrs.new_event_loop`` (or the stdlib's loop class under
``--no-zuvrs``) for tests that make loops themselves.
"""

import asyncio
import sys
import warnings

import pytest

_STATE_KEY = "_zuvrs_saved_policy"


def pytest_addoption(parser):
    group = parser.getgroup("zuvrs", "zuvrs event loop")
    group.addoption(
        "--no-zuvrs",
        action="store_true",
        dest="no_zuvrs",
        default=False,
        help="keep asyncio's own event loops (the zuvrs plugin stays loaded but does nothing)",
    )


def _active(config):
    return not config.getoption("no_zuvrs", default=False)


def _get_policy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return asyncio.get_event_loop_policy()


def _set_policy(policy):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(policy)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not _active(config):
        return
    import zuvrs

    saved = _get_policy()
    setattr(config, _STATE_KEY, saved)
    zuvrs.install()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not hasattr(config, _STATE_KEY):
        return
    saved = getattr(config, _STATE_KEY)
    delattr(config, _STATE_KEY)
    _set_policy(saved)


def pytest_report_header(config):
    import zuvrs

    libuv = ".".join(str(n) for n in zuvrs.libuv_version())
    if _active(config):
        return f"zuvrs: {zuvrs.__version__} (libuv {libuv}), async tests run on zuvrs loops"
    return f"zuvrs: {zuvrs.__version__} (libuv {libuv}), disabled by --no-zuvrs"


@pytest.fixture(scope="session")
def zuvrs_loop_factory(pytestconfig):
    """A loop factory: zuvrs.new_event_loop, or asyncio's default loop class
    under --no-zuvrs."""
    if _active(pytestconfig):
        import zuvrs

        return zuvrs.new_event_loop
    if sys.platform == "win32":  # pragma: no cover - zuvrs is POSIX-only
        return asyncio.ProactorEventLoop
    return asyncio.SelectorEventLoop
