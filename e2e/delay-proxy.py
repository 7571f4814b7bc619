#!/usr/bin/env python3
"""A loopback TCP proxy that delays every chunk by a fixed one-way latency in
each direction (so a round trip gains 2x LATENCY_MS), like the tests' fault
proxy (tests/common/proxy.rs). For e2e/bench-make-mirror.sh --wan.

    delay-proxy.py LISTEN_PORT UPSTREAM_PORT ONE_WAY_MS

Loopback only (127.0.0.1 both sides). Reading and delayed writing run
concurrently, so the latency does not reduce throughput. Prints "ready" once
listening. Stops on SIGTERM.
"""
import asyncio
import signal
import sys


async def pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read():
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay, data))
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
    delay = one_way_ms / 1000.0

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, sw, delay), pipe(sr, cw, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    asyncio.run(main())
