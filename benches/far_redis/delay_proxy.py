#!/usr/bin/env python3
"""A TCP proxy that holds every chunk DELAY_MS in each direction, for
benches/far_redis.sh: Redis "a few milliseconds away" on one machine.

    python3 delay_proxy.py LISTEN_PORT UPSTREAM_PORT DELAY_MS

A delay line per direction: the reader stamps each chunk with when it may go
on, the writer passes chunks on in order, each at its time, so one chunk's
wait does not add to the next one's. asyncio's timers round up to the
event loop's (epoll's) millisecond, so 0.5 ms each way comes to about 2 to
2.5 ms per round trip: measure it (the script runs redis-cli --latency).
"""
import asyncio
import sys


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    line = asyncio.Queue()

    async def read():
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                line.put_nowait((loop.time() + delay, chunk))
        except (ConnectionError, OSError):
            pass
        line.put_nowait(None)

    async def write():
        try:
            while True:
                item = await line.get()
                if item is None:
                    break
                due, chunk = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    await asyncio.gather(read(), write())


async def main():
    listen, upstream, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    delay = delay_ms / 1000.0

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        for w in (client_w, server_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            pump(client_r, server_w, delay), pump(server_r, client_w, delay)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
