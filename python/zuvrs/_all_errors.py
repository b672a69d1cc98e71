"""``create_connection(all_errors=True)`` on Python 3.11.

asyncio added ``all_errors`` in 3.12: when every connection attempt fails,
an ExceptionGroup of all their errors is raised instead of one OSError.
3.11 has ExceptionGroup but not the option; zuvrs offers it there too. (3.10
has neither, and its TypeError for the keyword stays, as in the stdlib.)

asyncio's create_connection records each attempt's errors in a list it
hands to ``_connect_sock``; the override below notes that list for the call
in progress (through a context variable, which reaches the attempts also
when happy eyeballs runs them in tasks of their own), so the errors can be
grouped once asyncio has given up.
"""

import contextvars
import sys

__all__ = ("EMULATED", "AllErrorsMixin", "create_connection_all_errors")

#: Whether zuvrs provides all_errors itself (asyncio's create_connection
#: lacks it).
EMULATED = (3, 11) <= sys.version_info < (3, 12)

_attempts = contextvars.ContextVar("zuvrs_connect_attempts", default=None)


async def create_connection_all_errors(base_create_connection, protocol_factory, host, port, *,
                                       all_errors, **kwargs):
    """asyncio's `base_create_connection(...)` with all_errors (3.11)."""
    if not all_errors:
        return await base_create_connection(protocol_factory, host, port, **kwargs)
    attempts = []
    token = _attempts.set(attempts)
    try:
        return await base_create_connection(protocol_factory, host, port, **kwargs)
    except OSError as exc:
        # attempts: asyncio's lists (one per call) of per-address error lists
        errors = [e for lists in attempts for per_address in lists for e in per_address]
        if _is_final_connect_error(exc, errors):
            raise ExceptionGroup("create_connection failed", errors) from None  # noqa: F821 (3.11)
        raise
    finally:
        _attempts.reset(token)


class AllErrorsMixin:
    if EMULATED:

        async def _connect_sock(self, exceptions, addr_info, local_addr_infos=None):
            attempts = _attempts.get()
            if attempts is not None:
                for noted in attempts:
                    if noted is exceptions:
                        break
                else:
                    attempts.append(exceptions)
            try:
                return await super()._connect_sock(exceptions, addr_info, local_addr_infos)
            finally:
                # This frame is in the traceback of a failed attempt's error,
                # which the list holds: clear it, as asyncio's _connect_sock
                # does, so the error is not kept alive by a cycle.
                exceptions = attempts = noted = None


def _is_final_connect_error(exc, errors):
    """Whether `exc` is what asyncio raises once every attempt failed: one of
    their errors, or an OSError listing them all."""
    if not errors:
        return False
    if any(exc is e for e in errors):
        return True
    combined = "Multiple exceptions: {}".format(", ".join(str(e) for e in errors))
    return type(exc) is OSError and exc.args == (combined,)
