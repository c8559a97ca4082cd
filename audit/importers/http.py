"""One HTTP exchange with a total deadline and a size cap: how importers read a server.

A server is input like any file. The socket timeout of ``requests`` bounds each read, not
the whole answer, so a server sending one byte at a time could hold an import for ever: the
exchange runs in a worker thread that is cut off at the deadline (its connection shut down,
so it stops reading too). The body is counted as it arrives, after decompression, and an
answer larger than the cap is refused before it fills memory. Used by the MLflow tracking
server reader and the Prometheus reader, which add their own retries and messages.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.structures import CaseInsensitiveDict

DEADLINE_GRACE_S = 1.0


def redact_url(uri: str) -> str:
    """The URI without user, password or query string (tokens sometimes travel there)."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class Incomplete(Exception):
    """No whole answer within the deadline (callers retry it like a timeout)."""


class TooLarge(Exception):
    def __init__(self, size: int):
        self.size = size


@dataclass(frozen=True)
class Answer:
    status: int
    headers: CaseInsensitiveDict  # a server may spell 'location' in any case
    body: bytes


def exchange(
    session: requests.Session,
    method: str,
    url: str,
    timeout: float,
    max_bytes: int,
    allow_redirects: bool = True,
    **arguments,
) -> Answer:
    """One request: its status, headers and body, within ``timeout`` seconds in all and at
    most ``max_bytes`` of (decompressed) body. Raises ``Incomplete`` at the deadline,
    ``TooLarge`` past the cap, ``requests`` errors for a failed connection, and
    ``ChunkedEncodingError`` for an answer broken off."""
    outcome: dict = {}
    done = threading.Event()
    cancelled = threading.Event()

    def work() -> None:
        try:
            outcome["result"] = _read_answer(
                session, method, url, timeout, max_bytes, allow_redirects, arguments,
                outcome, cancelled,
            )  # fmt: skip
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="audit-http", daemon=True).start()
    # a little beyond the socket timeout, so a single stalled read still reports as one
    if not done.wait(timeout + DEADLINE_GRACE_S):
        cancelled.set()
        response = outcome.get("response")
        if response is not None:
            response.raw.shutdown()  # unblocks a read in progress
        raise Incomplete
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _read_answer(
    session, method, url, timeout, max_bytes, allow_redirects, arguments, outcome, cancelled
) -> Answer:
    response = session.request(
        method, url, timeout=timeout, stream=True, allow_redirects=allow_redirects, **arguments
    )
    outcome["response"] = response
    complete = False
    try:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise TooLarge(int(declared))
        body = bytearray()
        while not cancelled.is_set():
            # read1: what has arrived, so the loop sees the deadline between reads
            chunk = response.raw.read1(1 << 16, decode_content=True)
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise TooLarge(len(body))
        if cancelled.is_set():
            raise Incomplete
        complete = True
        return Answer(response.status_code, CaseInsensitiveDict(response.headers), bytes(body))
    except (TooLarge, Incomplete):
        raise
    except Exception as exc:  # urllib3's protocol and read errors: a broken answer
        raise requests.exceptions.ChunkedEncodingError(str(exc)) from None
    finally:
        if complete:
            response.raw.release_conn()  # read to the end: the connection can be reused
        else:
            response.close()
