"""What a zuvrs loop tells you about itself: loop.stats().

    python examples/loop_metrics.py

A loop with its timing on (``zuvrs.new_event_loop(stats=True)``) runs 1,000
quick callbacks, an echo of 64 KiB over TCP, and one callback that blocks
the loop for 50 ms, as a slow handler in a service would. The snapshot
shows the counts, how late callbacks ran because of the stall, which
callback it was (named as asyncio's debug mode would name it, without
debug mode), the transport's figures, and the Prometheus lines a scrape
would get.
"""

import asyncio
import time

import zuvrs
import zuvrs.stats


def handle_report() -> None:
    time.sleep(0.05)  # blocking work on the loop: what the metrics catch


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
    writer.close()


async def main() -> None:
    loop = asyncio.get_running_loop()

    done = loop.create_future()
    for _ in range(999):
        loop.call_soon(int)
    loop.call_soon(done.set_result, None)
    await done

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    writer.write(b"x" * 65536)
    await reader.readexactly(65536)
    print(f"client transport: {writer.get_extra_info('zuvrs_stats')}")
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()

    loop.call_soon(handle_report)
    loop.call_soon(int)  # ready behind the stall: it runs 50 ms late
    await asyncio.sleep(0.01)


loop = zuvrs.new_event_loop(stats=True)
loop.run_until_complete(main())
s = loop.stats()
print(f"turns {s.turns}, callbacks {s.callbacks}, at least 1,000: {s.callbacks >= 1000}")
print(f"bytes through the loop's transports: read {s.transports.bytes_read:,},"
      f" written {s.transports.bytes_written:,}")
print(f"lag: p50 {s.lag.p50 * 1e3:.3f} ms, max {s.lag.max * 1e3:.0f} ms; at least 50 ms: {s.lag.max >= 0.05}")
slowest = s.slowest_callbacks[0]
print(f"slowest callback: {slowest.name} took {slowest.duration * 1e3:.0f} ms;"
      f" at least 50 ms: {slowest.duration >= 0.05}")
print(zuvrs.stats.summary(s))
metrics = zuvrs.stats.prometheus({"main": loop})
print("\n".join(line for line in metrics.splitlines() if line.startswith("zuvrs_loop_callbacks_total")))
loop.close()
