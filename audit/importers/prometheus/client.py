"""Talking to a server with the Prometheus HTTP API: credentials, retries, bounded answers.

Every request goes through ``audit.importers.http.exchange`` (a total deadline, a cap on the
decompressed body), is retried with exponential back-off when the server or the network
fails for a moment (connection errors, timeouts, HTTP 429/502/503/504, a body cut short),
and ends in an error naming the request when it cannot succeed. The answer is checked
against the envelope the API documents (``status``, ``data``, ``errorType``, ``error``).

Credentials come from an environment variable or a file (a bearer token, or a password for
basic auth with a user name), or from the URL's user part; they live only in the session's
headers: never in the location stored, in a message or in the file log. Redirects are
followed only to the same scheme, host and port (the credentials are sent nowhere else); a
redirect elsewhere is an error naming the request and the redirect's host.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter

from audit.errors import InputError, SourceUnavailable
from audit.importers import http
from audit.importers.http import redact_url
from audit.text import terminal_safe

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class Credentials:
    """Where the secrets are, never the secrets: resolved when the client is made."""

    bearer_token_file: Path | None = None
    bearer_token_env: str | None = None
    user: str | None = None
    password_file: Path | None = None
    password_env: str | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False


def _secret(path: Path | None, env: str | None, what: str) -> str | None:
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise InputError(f"{what} file {path}: cannot read ({reason})") from None
        if not text.strip():
            raise InputError(f"{what} file {path}: empty")
        return text.strip()
    if env is not None:
        value = os.environ.get(env, "")
        if not value.strip():
            raise InputError(f"{what} environment variable {env} is not set or empty")
        return value.strip()
    return None


class ApiError(InputError):
    """The server refused a request (HTTP 4xx other than 408/429, or status "error")."""

    def __init__(self, location: str, what: str, status: int, kind: str, message: str):
        self.status = status
        self.kind = kind
        self.message = message
        self.request = f"{location}: {what}"
        super().__init__(
            f"{self.request} failed: HTTP {status} {kind}: {message}; nothing was stored"
        )


class PrometheusClient:
    def __init__(
        self,
        url: str,
        credentials: Credentials,
        timeout_s: float,
        max_retries: int,
        backoff_s: float,
        max_response_bytes: int,
        concurrency: int,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(
                f"--url {redact_url(url)!r}: expected http(s)://HOST[:PORT][/PATH] of a "
                "server with the Prometheus HTTP API"
            )
        self.location = redact_url(url)
        self.base = self.location + "/"
        self._origin = (parts.scheme, parts.hostname, parts.port)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_response_bytes = max_response_bytes
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy or .netrc credentials from the environment
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=concurrency)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = "audit-prometheus-importer"
        token = _secret(
            credentials.bearer_token_file, credentials.bearer_token_env, "--bearer-token"
        )
        password = _secret(credentials.password_file, credentials.password_env, "--password")
        user = credentials.user or parts.username
        if token and (user or password):
            raise InputError("give a bearer token or basic auth (--user), not both")
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        elif user:
            self.session.auth = (user, password or parts.password or "")
        elif password:
            raise InputError("a password needs --user NAME (basic auth)")
        if credentials.ca_file is not None:
            if not credentials.ca_file.is_file():
                raise InputError(f"--ca-file {credentials.ca_file}: no such file")
            self.session.verify = str(credentials.ca_file)
        if credentials.insecure_skip_verify:
            self.session.verify = False

    def close(self) -> None:
        self.session.close()

    def call(self, method: str, endpoint: str, params: list[tuple[str, str]], what: str):
        """The ``data`` of one API call, retried; ``what`` names the request in messages."""
        url = urljoin(self.base, endpoint)
        last_problem = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                answer = self._follow(method, url, params, what)
            except requests.ConnectionError as exc:
                last_problem = (
                    f"no complete answer within {self.timeout_s:g} s"
                    if isinstance(exc, requests.Timeout)
                    else "connection failed"
                )
                continue
            except (requests.Timeout, http.Incomplete):
                last_problem = f"no complete answer within {self.timeout_s:g} s"
                continue
            except requests.exceptions.ChunkedEncodingError:
                last_problem = "the answer was cut short"
                continue
            except http.TooLarge as exc:
                raise SourceUnavailable(
                    f"{self.location}: {what}: the answer is larger than "
                    f"{self.max_response_bytes / 2**20:,.0f} MB ({exc.size / 2**20:,.0f} MB so "
                    "far); refused before it fills memory (lower [prometheus] "
                    "max_points_per_query, or raise max_response_mb); nothing was stored"
                ) from None
            if answer.status in RETRYABLE_STATUS:
                last_problem = f"HTTP {answer.status}" + _error_text(answer.body, ": ")
                continue
            if answer.status in (401, 403):
                raise SourceUnavailable(
                    f"{self.location}: {what}: access denied (HTTP {answer.status}); pass "
                    "--bearer-token-file/--bearer-token-env or --user with --password-file/"
                    "--password-env; nothing was stored"
                )
            body = _envelope(answer, self.location, what)
            if answer.status >= 400 or body.get("status") != "success":
                raise ApiError(
                    self.location,
                    what,
                    answer.status,
                    _server_text(body.get("errorType", ""), 40),
                    _server_text(body.get("error", ""), 300),
                )
            return body.get("data")
        raise SourceUnavailable(
            f"{self.location}: {what}: still failing after {self.max_retries + 1} attempts "
            f"({last_problem}); check the server and run the import again (nothing was stored)"
        )

    def _follow(self, method: str, url: str, params, what: str) -> http.Answer:
        """One exchange, following redirects to the same origin only."""
        for _ in range(MAX_REDIRECTS + 1):
            arguments = {"data": params} if method == "POST" else {"params": params}
            answer = http.exchange(
                self.session,
                method,
                url,
                self.timeout_s,
                self.max_response_bytes,
                allow_redirects=False,
                **arguments,
            )
            if answer.status not in (301, 302, 303, 307, 308):
                return answer
            target = urljoin(url, answer.headers.get("Location", ""))
            parts = urlsplit(target)
            if (parts.scheme, parts.hostname, parts.port) != self._origin:
                raise InputError(
                    f"{self.location}: {what}: the server redirected to "
                    f"{redact_url(target)}, another host; not followed, so the credentials "
                    "go nowhere else (pass that server's address as --url); nothing was stored"
                )
            if answer.status == 303:
                method = "GET"
            url = target
        raise InputError(
            f"{self.location}: {what}: more than {MAX_REDIRECTS} redirects; nothing was stored"
        )


def _envelope(answer: http.Answer, location: str, what: str) -> dict:
    try:
        body = json.loads(answer.body) if answer.body else None
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
        snippet = _server_text(answer.body[:200].decode("utf-8", "replace"), 120)
        raise InputError(
            f"{location}: {what}: answered HTTP {answer.status} with {snippet!r}, not the "
            "JSON of the Prometheus HTTP API; is --url a Prometheus-compatible server?"
        )
    return body


def _error_text(raw: bytes, prefix: str) -> str:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    message = body.get("error") if isinstance(body, dict) else None
    return prefix + _server_text(message, 200) if isinstance(message, str) and message else ""


def _server_text(value: object, limit: int) -> str:
    """Text a server sent, for a message: one line, bounded, control characters escaped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return terminal_safe(text[:limit] + ("…" if len(text) > limit else ""))
