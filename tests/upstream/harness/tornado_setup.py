"""pytest plugin for Tornado's suite (tests/upstream/run.py, suite
``tornado``): the one piece of set-up its own runner
(``python -m tornado.test.runtests``) makes that its tests rely on.

The runner silences Tornado's access log before any test runs; the tests
then check that a request logged nothing unexpected, so without it every
request a test makes fails the test, on every loop.
"""

import logging


def pytest_configure(config):
    logging.getLogger("tornado.access").setLevel(logging.CRITICAL)
