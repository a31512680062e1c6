"""Connections that never finish sending are closed, and open connections are capped.

Uvicorn's own timeout (``timeout_keep_alive``) only starts after a response: a client that
connects and sends nothing, or sends its headers one byte every few seconds (slowloris),
holds a socket and a file descriptor forever, before any route or API key is checked. A
thousand such sockets exhaust the descriptors and every client then fails.

:func:`guarded_h11` is uvicorn's h11 protocol with three additions, all at the connection level:

- **a header deadline**: the request line and headers must all arrive within
  ``header_timeout_s`` of the connection (or of its first byte after a keep-alive pause).
  The deadline is absolute: trickling one byte at a time does not extend it;
- **a body deadline**: the whole body must arrive within ``body_timeout_s`` of the headers;
- **a cap on open connections**: past ``max_connections``, a new connection closes the oldest
  one that is idle or still sending its headers, else the oldest still sending its body, so
  slow sockets are the ones that go, never a request being answered. If every connection is
  being answered, the new one is closed instead;
- **a send deadline**: a response whose client accepts no byte for ``send_timeout_s`` (its
  writes stay blocked that long) is cut: the connection is aborted, as nginx's
  ``send_timeout`` does. Nothing more can reach a client that reads nothing.

A connection past a header or body deadline gets ``408 Request Timeout`` and is closed. Its
handler, if one started, sees the client as gone, as for any disconnect.

**Bytes held for a client that stopped reading.** A response's writes block (and the app
notices, see app.py: its stream is paused) once the client's own receive buffer is full
(its choice: a few kB to MBs) and then, on our side, at most ``UNSENT_BYTES_LIMIT`` bytes in
the kernel plus ``WRITE_HIGH_WATER_BYTES`` in asyncio's buffer, plus the chunk being written.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

# Written raw: before the headers are complete, h11 cannot send a response yet.
_TIMEOUT_BODY = b"the request was not sent in time\n"
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)
logger = logging.getLogger(__name__)

# Asyncio's default pauses a response only past 64 KiB of unsent bytes; a smaller mark
# makes a client that stops reading visible sooner (see app.py: slow readers). Bytes.
WRITE_HIGH_WATER_BYTES = 2 * 1024
# Bytes the kernel takes from us that it has not sent yet (TCP_NOTSENT_LOWAT). A client that
# stops reading closes its TCP window, nothing more leaves, and our writes block after these
# few bytes instead of after the whole send buffer (about 140 SSE chunks of 32 KiB). Bytes
# in flight (sent, not yet acknowledged) do not count, so a fast client far away still
# streams at full speed. About 10 SSE chunks.
UNSENT_BYTES_LIMIT = 2 * 1024
# The send buffer is capped too (the only limit where TCP_NOTSENT_LOWAT is missing): the
# kernel's grows by itself up to MBs (net.ipv4.tcp_wmem). 16 KiB (the kernel doubles it)
# still carries about 0.3 MB/s per connection at a 100 ms round trip: over 1,000 SSE chunks/s.
SEND_BUFFER_BYTES = 16 * 1024
FD_RESERVE = 48  # descriptors kept for the process itself (it uses about 10 when idle)


def _soft_fd_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def default_max_connections(reserve: int = FD_RESERVE, ceiling: int = 1024) -> int:
    """Open connections to allow: half of the soft file-descriptor limit left after ``reserve``
    (model files, logs, the engine), at most ``ceiling``, at least 8. The other half is room
    for a burst of new connections, which are accepted (each an fd) before any can be closed."""
    soft = _soft_fd_limit()
    if soft is None:
        return ceiling
    return max(8, min(ceiling, (soft - reserve) // 2))


def accept_backlog(max_connections: int, reserve: int = FD_RESERVE, ceiling: int = 2048) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one go: what
    the descriptors left after ``max_connections`` and ``reserve`` allow (at most ``ceiling``),
    so a burst of connections does not run out of them (``accept`` failing with EMFILE)."""
    soft = _soft_fd_limit()
    if soft is None:
        return ceiling
    return max(8, min(ceiling, soft - max_connections - reserve))


class GuardStats:
    """Counts of what the guard did, for ``/metrics``."""

    def __init__(self) -> None:
        self.header_timeouts = 0
        self.body_timeouts = 0
        self.evicted = 0
        self.refused = 0
        self.send_timeouts = 0
        self.open = 0


def limit_unsent_bytes(sock: socket.socket) -> None:
    """Make writes to ``sock`` block early when its peer stops reading: at most
    ``UNSENT_BYTES_LIMIT`` bytes wait unsent in the kernel (else, where that option is missing,
    a send buffer of ``SEND_BUFFER_BYTES``). A socket that is not TCP is left as it is."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_BYTES_LIMIT)
    except (OSError, AttributeError):  # not a TCP socket, or no TCP_NOTSENT_LOWAT here
        pass


def guarded_h11(
    header_timeout_s: float = 10.0,
    body_timeout_s: float = 30.0,
    max_connections: int | None = None,
    stats: GuardStats | None = None,
    send_timeout_s: float = 60.0,
) -> type[H11Protocol]:
    """Uvicorn's h11 protocol with header/body/send deadlines (seconds) and a connection cap.

    Pass the result as ``uvicorn.Config(http=...)``. ``max_connections`` defaults to
    :func:`default_max_connections`.
    """
    if header_timeout_s <= 0 or body_timeout_s <= 0 or send_timeout_s <= 0:
        raise ValueError(
            f"timeouts must be > 0 s, got header {header_timeout_s}, body {body_timeout_s}, "
            f"send {send_timeout_s}"
        )
    cap = max_connections if max_connections is not None else default_max_connections()
    if cap < 1:
        raise ValueError(f"max_connections must be >= 1, got {cap}")
    counts = stats or GuardStats()

    class GuardedH11Protocol(H11Protocol):
        guard_stats = counts
        max_open = cap

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._send_deadline: asyncio.TimerHandle | None = None
            self._reading_body = False
            self._waiting_since = 0.0

        # --- connection life ----------------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                limit_unsent_bytes(sock)
            self._waiting_since = self.loop.time()
            self._arm(header_timeout_s, body=False)
            if len(self.connections) > self.max_open:
                self._make_room()
            counts.open = len(self.connections)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._stop_send_clock()
            super().connection_lost(exc)
            counts.open = len(self.connections)

        def _between_requests(self) -> bool:
            """Idle or still sending headers: closing it loses no work."""
            return self.cycle is None or self.cycle.response_complete

        def _still_uploading(self) -> bool:
            """Its body is still arriving: closing it loses only the upload."""
            cycle = self.cycle
            return cycle is not None and cycle.more_body and not cycle.response_started

        def _make_room(self) -> None:
            others = [
                c
                for c in self.connections
                if c is not self
                and isinstance(c, GuardedH11Protocol)
                and not c.transport.is_closing()
            ]
            for may_go in (GuardedH11Protocol._between_requests, GuardedH11Protocol._still_uploading):
                candidates = [c for c in others if may_go(c)]
                if candidates:
                    oldest = min(candidates, key=lambda c: c._waiting_since)
                    counts.evicted += 1
                    oldest._close(timed_out=False)
                    return
            # Every other connection is being answered: this one waits for nothing but a slot.
            counts.refused += 1
            self._disarm()
            self.transport.close()

        # --- the send deadline: the client must accept some bytes ---------------------------
        def pause_writing(self) -> None:
            """asyncio: our buffer is past its high-water mark (the client takes nothing)."""
            super().pause_writing()
            if self._send_deadline is None:
                self._send_deadline = self.loop.call_later(send_timeout_s, self._send_expired)

        def resume_writing(self) -> None:
            """asyncio: the client took enough bytes for the buffer to fall to its low mark."""
            super().resume_writing()
            self._stop_send_clock()

        def _stop_send_clock(self) -> None:
            if self._send_deadline is not None:
                self._send_deadline.cancel()
                self._send_deadline = None

        def _send_expired(self) -> None:
            self._send_deadline = None
            counts.send_timeouts += 1
            logger.info(
                "closed the connection of %s: the client accepted no byte of its response "
                "for %g s", f"{self.client[0]}:{self.client[1]}" if self.client else "a client",
                send_timeout_s,
            )
            # Abort, not close: close() would wait for the buffered bytes to leave, which a
            # client that reads nothing never lets happen.
            self.transport.abort()

        # --- deadlines ----------------------------------------------------------------------
        def _arm(self, seconds: float, body: bool) -> None:
            self._disarm()
            self._reading_body = body
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self._between_requests():
                # The first byte of a new request on a kept-alive connection.
                self._waiting_since = self.loop.time()
                self._arm(header_timeout_s, body=False)
            cycle_before = self.cycle
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle is not cycle_before and cycle.more_body:
                    self._arm(body_timeout_s, body=True)  # headers in: now the body's turn
                elif not cycle.more_body:
                    self._disarm()  # the whole request is in

        def on_response_complete(self) -> None:
            self._waiting_since = self.loop.time()
            super().on_response_complete()

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self._reading_body:
                if self.cycle is None or not self.cycle.more_body:
                    return
                counts.body_timeouts += 1
            elif not self._between_requests():
                return
            else:
                counts.header_timeouts += 1
            self._close(timed_out=True)

        def _close(self, timed_out: bool) -> None:
            self._disarm()
            cycle = self.cycle
            if timed_out and (cycle is None or cycle.response_complete or not cycle.response_started):
                try:
                    self.transport.write(_TIMEOUT_RESPONSE)
                except Exception:  # the socket may already be broken: closing is what matters
                    pass
            self.transport.close()

    return GuardedH11Protocol
