"""The serving host's HTTP protocol: uvicorn's httptools one, each answer leaving in one write.

uvicorn writes an answer's status line and headers, then its body, each as soon as the app
sends it: two send() calls per request, and on a loopback or LAN connection each runs the
network stack's whole path (the client's wake-up included). The writes of one turn of the event
loop are joined here and leave together at its end: one send() per answer, the same bytes."""

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class JoinedWrites:
    """A connection's transport whose writes within one turn of the event loop are sent as
    one; everything else is the transport's own. Closing sends what is pending first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class HostProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over ``JoinedWrites``."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(JoinedWrites(transport, self.loop))
