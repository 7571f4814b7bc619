#!/usr/bin/env python3
"""A loopback TCP proxy that delays every chunk by a one-way latency in each
direction (so a round trip gains 2x ONE_WAY_MS), like the tests' fault proxy
(tests/common/proxy.rs). For e2e/bench-make-mirror.sh --wan and the links of
e2e/multiregion.sh (up --link-delay/--link-jitter).

    delay-proxy.py LISTEN_PORT UPSTREAM_PORT ONE_WAY_MS [JITTER_MS]

With JITTER_MS, each chunk is delayed by ONE_WAY_MS plus a uniform random
0..JITTER_MS, but never sent before the chunk before it (the byte stream
keeps its order, as TCP's would: a late chunk holds up the ones behind it).
Loopback only (127.0.0.1 both sides). Reading and delayed writing run
concurrently, so the latency does not reduce throughput. Prints "ready" once
listening. Stops on SIGTERM.
"""
import asyncio
import random
import signal
import sys


async def pipe(reader, writer, delay, jitter):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read():
        last = 0.0
        while True:
            data = await reader.read(65536)
            due = loop.time() + delay
            if jitter > 0:
                due += random.uniform(0.0, jitter)
            # Never before the chunk ahead of it: order is kept.
            last = max(last, due)
            await queue.put((last, data))
            if not data:
                return

    async def write():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                try:
                    writer.write_eof()
                except OSError:
                    pass
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(read(), write())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main():
    listen, upstream, one_way_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    jitter_ms = float(sys.argv[4]) if len(sys.argv) == 5 else 0.0
    if one_way_ms < 0 or jitter_ms < 0:
        print("ONE_WAY_MS and JITTER_MS must not be negative", file=sys.stderr)
        sys.exit(2)
    delay, jitter = one_way_ms / 1000.0, jitter_ms / 1000.0

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, sw, delay, jitter), pipe(sr, cw, delay, jitter))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    asyncio.run(main())
