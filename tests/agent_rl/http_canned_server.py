"""An HTTP/1.1 server in a process of its own that answers every request with one canned body
(tests/agent_rl/test_tool_output_fuzz.py: a measure of the client's event-loop stalls must not
count the GIL held by a server thread in the same process).

    python tests/agent_rl/http_canned_server.py BODY_FILE   # prints its port, serves until killed
"""

from __future__ import annotations

import asyncio
import sys

BODY = open(sys.argv[1], "rb").read()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(BODY))
        writer.write(BODY)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
