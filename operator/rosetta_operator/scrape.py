"""One bounded HTTP GET of rank 0's /metrics, for the progress daemon (handlers.update_progress).

Rank 0 runs whatever image the training names, so its endpoint is treated as untrusted:

    time       the whole exchange (connect, request, status line, headers, body) ends within
               `timeout` seconds: each read waits at most for what is left of it, so a server that
               trickles a byte at a time cannot hold the operator's thread longer
    size       at most `max_bytes` (1 MiB) of body are read; a larger Content-Length is refused
               without reading, an endless or larger body is cut there. The trainer's own page is
               a few KiB
    redirects  never followed: any answer but 200 is a failure, a 3xx included (urllib would
               follow it, to any host)
    proxies    never used: the pod IP is reached directly, whatever HTTP_PROXY says

Failures raise ScrapeFailed with the progress outcome (`unreachable`, `too_large`) and a reason for
the log; the reason never quotes the reply.
"""

from __future__ import annotations

import http.client
import socket
import time
from typing import Any
from urllib.parse import urlsplit

# The trainer's metrics page is a few KiB; a reply this large is not the trainer's.
MAX_BYTES = 1 << 20
# A trainer that does not answer this fast is busy or gone; the next round tries again.
TIMEOUT = 3.0


class ScrapeFailed(Exception):
    """`outcome` is the progress outcome to count; `notable` says whether it is worth a log line
    (a trainer that is starting refuses connections every round: not news)."""

    def __init__(self, outcome: str, reason: str, notable: bool = True):
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason
        self.notable = notable


class _DeadlineSocket(socket.socket):
    """Every receive waits at most until `deadline` (time.monotonic()), whatever came before."""

    __slots__ = ("deadline",)
    deadline: float

    def _remaining(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        return remaining

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:  # what the response's buffered reader calls
        self.settimeout(self._remaining())
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.settimeout(self._remaining())
        return super().recv(bufsize, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.settimeout(self._remaining())
        return super().sendall(data, flags)


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float):
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self.deadline = deadline

    def connect(self) -> None:
        family, type_, proto, _, address = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        sock = _DeadlineSocket(family, type_, proto)
        sock.deadline = self.deadline
        try:
            sock.settimeout(sock._remaining())
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def get(url: str, *, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES) -> str:
    """The body of a 200 answer to GET `url` (http only), decoded as UTF-8 with replacement."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ScrapeFailed("unreachable", f"not an http://host:port URL: {url}")
    deadline = time.monotonic() + timeout
    conn = _Connection(parts.hostname, parts.port, deadline)
    try:
        conn.request("GET", parts.path or "/", headers={"Accept": "text/plain", "Accept-Encoding": "identity"})
        response = conn.getresponse()
        if response.status != 200:
            redirect = 300 <= response.status < 400
            raise ScrapeFailed("unreachable", f"{url} answered {response.status}"
                               + ("; redirects are not followed" if redirect else ""), notable=redirect)
        length = response.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > max_bytes:
            raise ScrapeFailed("too_large", f"{url} announced {int(length)} bytes, more than the {max_bytes} "
                                            "a scrape reads; not read")
        body = response.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise ScrapeFailed("too_large", f"{url} sent more than the {max_bytes} bytes a scrape reads; "
                                            "the rest was not read")
        return body.decode("utf-8", errors="replace")
    except ScrapeFailed:
        raise
    except TimeoutError:  # busy or gone, or a trickle: the same to the next round
        raise ScrapeFailed("unreachable", f"{url} did not answer within {timeout:g} s", notable=False) from None
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, not HTTP, cut short
        raise ScrapeFailed("unreachable", f"{url}: {type(exc).__name__}", notable=False) from None
    finally:
        conn.close()
