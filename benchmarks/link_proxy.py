"""A TCP proxy that behaves like a slower link: one-way delay (half the round-trip time) and a bandwidth limit,
each direction on its own. For benchmarks only: it listens on the loopback interface, forwards to one loopback
address, and exits after --seconds at the latest.

    python -m benchmarks.link_proxy --listen 127.0.0.1:56100 --to 127.0.0.1:56001 --rtt-ms 50 --mbit 100

This machine's kernel has no netem (``tc qdisc ... netem``: "Specified qdisc kind is unknown"), so the link is
modelled here: every chunk read is written after the link has carried the chunks before it (its size / rate)
and then the one-way delay, in order. The proxy prints "forwarding" once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"link_proxy: only loopback addresses, not {text}")
    return host, int(port)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, rate: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[bytes, float]] = asyncio.Queue()
    free_at = loop.time()

    async def deliver() -> None:
        while True:
            data, due = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(1 << 16):
            start = max(loop.time(), free_at)
            free_at = start + len(data) * 8 / rate  # the link is busy carrying this chunk until then
            queue.put_nowait((data, free_at + delay))
    finally:
        queue.put_nowait((b"", 0.0))
        with contextlib.suppress(Exception):
            await sender
        writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int], rtt: float, rate: float, seconds: float) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*target)
        await asyncio.gather(_pump(client_reader, server_writer, rtt / 2, rate),
                             _pump(server_reader, client_writer, rtt / 2, rate), return_exceptions=True)

    server = await asyncio.start_server(handle, *listen)
    print("forwarding", flush=True)
    async with server:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.serve_forever(), timeout=seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--rtt-ms", type=float, required=True)
    parser.add_argument("--mbit", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=1800.0, help="exit after this long at the latest")
    args = parser.parse_args()
    asyncio.run(serve(_address(args.listen), _address(args.to), args.rtt_ms / 1000.0, args.mbit * 1e6,
                      args.seconds))


if __name__ == "__main__":
    main()
