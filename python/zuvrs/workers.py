"""Gunicorn worker classes that run their application on zuvrs loops.

    gunicorn -k zuvrs.workers.UvicornWorker app:app         # ASGI, via uvicorn
    gunicorn -k zuvrs.workers.GunicornWebWorker app:make_app  # aiohttp.web
    gunicorn -k zuvrs.workers.ASGIWorker app:app             # gunicorn's own ASGI worker

``UvicornWorker`` is uvicorn's worker (the ``uvicorn-worker`` package, or
``uvicorn.workers`` where that is not installed) with ``loop`` set to
``zuvrs:new_event_loop``; ``UvicornH11Worker`` the same with the pure-Python
h11 parser. ``GunicornWebWorker`` is aiohttp's ``GunicornWebWorker`` on
zuvrs, the counterpart of ``aiohttp.GunicornUVLoopWebWorker``: it installs
``zuvrs.EventLoopPolicy`` in the worker, so ``asyncio.new_event_loop()`` in
the application gives zuvrs loops too. ``ASGIWorker`` is gunicorn's ASGI
worker (gunicorn 24+, ``-k asgi``) with a zuvrs loop in place of its
``--asgi-loop`` choice.

Each class is made on first access, so importing this module (or zuvrs)
imports none of gunicorn, uvicorn or aiohttp; only the worker used needs its
server installed.
"""

import asyncio
import warnings

# (Built on first use by __getattr__.)
__all__ = ("GunicornWebWorker", "UvicornWorker", "UvicornH11Worker", "ASGIWorker")  # noqa: F822

LOOP = "zuvrs:new_event_loop"


def _uvicorn_base():
    try:
        from uvicorn_worker import UvicornWorker
    except ImportError:
        # uvicorn's own copy, deprecated in favour of the uvicorn-worker package.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                from uvicorn.workers import UvicornWorker
            except ImportError as exc:
                raise ImportError(
                    "zuvrs.workers.UvicornWorker needs uvicorn and gunicorn "
                    "(pip install uvicorn-worker)"
                ) from exc
    from uvicorn.config import Config

    if not hasattr(Config, "get_loop_factory"):
        raise ImportError(
            "zuvrs.workers.UvicornWorker needs uvicorn 0.36 or later "
            "(loop factories given as import strings)"
        )
    return UvicornWorker


def _make_uvicorn_worker():
    base = _uvicorn_base()

    class UvicornWorker(base):
        """uvicorn's Gunicorn worker with zuvrs loops (``loop="zuvrs:new_event_loop"``)."""

        CONFIG_KWARGS = {**base.CONFIG_KWARGS, "loop": LOOP}

    UvicornWorker.__module__ = __name__
    return UvicornWorker


def _make_uvicorn_h11_worker():
    base = _get("UvicornWorker")

    class UvicornH11Worker(base):
        """zuvrs's UvicornWorker with uvicorn's pure-Python h11 HTTP parser."""

        CONFIG_KWARGS = {**base.CONFIG_KWARGS, "http": "h11"}

    UvicornH11Worker.__module__ = __name__
    return UvicornH11Worker


def _install_policy():
    import zuvrs

    # As aiohttp's uvloop worker: close the loop inherited from the arbiter
    # (if any) before the policy changes.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            asyncio.get_event_loop().close()
        except RuntimeError:
            pass
    zuvrs.install()


def _make_aiohttp_worker():
    try:
        from aiohttp.worker import GunicornWebWorker as base
    except ImportError as exc:
        raise ImportError(
            "zuvrs.workers.GunicornWebWorker needs aiohttp and gunicorn"
        ) from exc

    class GunicornWebWorker(base):
        """aiohttp's Gunicorn worker on a zuvrs loop (the counterpart of
        ``aiohttp.GunicornUVLoopWebWorker``)."""

        def init_process(self):
            # The policy makes asyncio.new_event_loop() in aiohttp's
            # init_process (and in the application) give a zuvrs loop.
            _install_policy()
            super().init_process()

    GunicornWebWorker.__module__ = __name__
    return GunicornWebWorker


def _make_asgi_worker():
    try:
        from gunicorn.workers.gasgi import ASGIWorker as base
    except ImportError as exc:
        raise ImportError(
            "zuvrs.workers.ASGIWorker needs gunicorn 24 or later (its asgi worker)"
        ) from exc
    if not hasattr(base, "_setup_event_loop"):
        raise ImportError(
            "zuvrs.workers.ASGIWorker: this gunicorn's ASGI worker sets its loop up "
            "in a way zuvrs does not know; use zuvrs.workers.UvicornWorker"
        )

    class ASGIWorker(base):
        """gunicorn's ASGI worker (``-k asgi``) on a zuvrs loop."""

        def _setup_event_loop(self):
            import zuvrs

            self.loop = zuvrs.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.log.debug("Using zuvrs event loop")

    ASGIWorker.__module__ = __name__
    return ASGIWorker


_FACTORIES = {
    "UvicornWorker": _make_uvicorn_worker,
    "UvicornH11Worker": _make_uvicorn_h11_worker,
    "GunicornWebWorker": _make_aiohttp_worker,
    "ASGIWorker": _make_asgi_worker,
}


def _get(name):
    cls = globals().get(name)
    if cls is None:
        cls = _FACTORIES[name]()
        cls.__qualname__ = name
        globals()[name] = cls
    return cls


def __getattr__(name):
    if name in _FACTORIES:
        return _get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

