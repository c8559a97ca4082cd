"""Reading a running MLflow tracking server through its documented REST API.

Runs come from ``runs/search`` with large pages (params, tags and latest metrics included),
experiments split into two groups searched at the same time; metric histories only for new
or changed runs: a hundred runs' history of one metric per request through the server's bulk
endpoint (the one MLflow's own UI uses), one run at a time through ``metrics/get-history``
where a server does not offer it. At most ``[mlflow] http_concurrency`` requests are under
way at once, and the next batch's histories are asked for while the current one is being
written. An unchanged run (same change signature) has no history fetched at all. Transient failures
(5xx, 429, resets, timeouts, truncated bodies) are retried with exponential backoff, then
end in ``SourceUnavailable``. Credentials come from the URI or MLflow's environment
variables and are never part of ``location``.

A server is input like any file: each request has a total deadline (a server sending one
byte at a time cannot hold the import), an answer larger than ``[mlflow] max_response_mb``
is refused before it fills memory, a page token that comes back again ends the paging,
every answer is checked against the shape the API documents (``fields``), and text the
server sends is shown with its control characters escaped.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import polars as pl
import requests
from requests.adapters import HTTPAdapter

from audit.errors import InputError, SourceUnavailable
from audit.importers import http, read
from audit.importers.http import redact_url
from audit.importers.mlflow import fields
from audit.importers.mlflow.base import (
    GIT_COMMIT_TAG,
    MODEL_VERSION_SCHEMA,
    RUN_NAME_TAG,
    KnownRuns,
)
from audit.importers.run_store import (
    DATASET_SCHEMA,
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
    frame,
    stable_hash,
)
from audit.text import terminal_safe

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
HISTORY_PAGE = 25_000
# MLflow's limits for metrics/get-history-bulk: run ids per request, points per answer (an
# answer that reaches it may have been cut, so its runs are asked again in halves).
BULK_RUNS = 100
BULK_POINTS = 25_000
RUNS_PER_BATCH = 500
SEARCH_EXPERIMENTS = 100  # experiment ids per runs/search request
# A search page costs MLflow seconds of CPU (it builds every run in Python): two searches
# at a time keep two workers busy; more would stack pages in the same workers until one
# misses the request deadline (seen at four on a loaded 2-core machine).
SEARCHES_AT_ONCE = 2
BATCHES_AHEAD = 2  # batches whose histories are being fetched while one is written
DEFAULT_MAX_RESPONSE_BYTES = 512 << 20
MAX_REDIRECTS = 5


class _NotServed(Exception):
    """The server does not offer an optional endpoint (HTTP 404)."""


class _Redirected(Exception):
    """A redirect that is not followed: why, in the user's words."""


class RestReader:
    kind = "http"

    def __init__(
        self,
        uri: str,
        timeout: float = 30.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        page_size: int = 1000,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        concurrency: int = 4,
    ):
        parts = urlsplit(uri)
        if not parts.hostname:
            raise InputError(f"{redact_url(uri)}: a tracking server URI needs a host")
        self.location = redact_url(uri)
        self.base = self.location
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.page_size = page_size
        self.max_response_bytes = max_response_bytes
        self.concurrency = concurrency
        self.session = requests.Session()
        # one kept-alive connection per concurrent request (requests keeps 10 by default)
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=concurrency)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = "audit-mlflow-importer"
        user = parts.username or os.environ.get("MLFLOW_TRACKING_USERNAME")
        password = parts.password or os.environ.get("MLFLOW_TRACKING_PASSWORD")
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        elif user:
            self.session.auth = (user, password or "")
        if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
            self.session.verify = False
        self._search_results: dict[str, dict] = {}
        self._bulk_history = True  # until the server answers 404 for it

    def close(self) -> None:
        self.session.close()

    # -- transport -------------------------------------------------------------------------
    def call(
        self, method: str, endpoint: str, payload: dict | None = None, optional: bool = False
    ) -> dict:
        """One API call, retried; ``optional`` endpoints (the UI's ``ajax-api``) raise
        ``_NotServed`` when the server answers 404."""
        api = "ajax-api" if optional else "api"
        url = f"{self.base}/{api}/2.0/mlflow/{endpoint}"
        last_problem = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, content = self._exchange(method, url, payload)
                if status in RETRYABLE_STATUS:
                    last_problem = f"HTTP {status}"
                    continue
                body = self._parsed(content, endpoint)
            except _Redirected as exc:
                raise InputError(f"{self.location}: {endpoint} {exc}") from None
            except (requests.ConnectionError, requests.Timeout) as exc:
                last_problem = type(exc).__name__
                continue
            except http.Incomplete:
                last_problem = f"no complete answer within {self.timeout:g} s"
                continue
            except (requests.exceptions.ChunkedEncodingError, ValueError):
                last_problem = "truncated or non-JSON response"
                continue
            except http.TooLarge as exc:
                raise SourceUnavailable(
                    f"{self.location}: {endpoint} answered with more than "
                    f"{self.max_response_bytes / 2**20:,.0f} MB ({exc.size / 2**20:,.0f} MB so "
                    "far); refused before it fills memory (raise [mlflow] max_response_mb if "
                    "the server is yours and the answer expected)"
                ) from None
            if status in (401, 403):
                raise SourceUnavailable(
                    f"{self.location}: access denied (HTTP {status}); set "
                    "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD"
                )
            if status == 404 and optional:
                raise _NotServed
            if status >= 400:
                code = body.get("error_code", "") if isinstance(body, dict) else ""
                message = body.get("message", "") if isinstance(body, dict) else ""
                raise SourceUnavailable(
                    f"{self.location}: {endpoint} failed with HTTP {status} "
                    f"{_server_text(code, 60)}: {_server_text(message, 200)}".rstrip(": ")
                )
            if not isinstance(body, dict):
                raise InputError(
                    f"{self.location}: {endpoint} answered with {fields.describe(body)}, not "
                    "the JSON object of the MLflow REST API; is this an MLflow server?"
                )
            return body
        raise SourceUnavailable(
            f"{self.location}: {endpoint} still failing after {self.max_retries + 1} attempts "
            f"({last_problem}); check the server and retry the import (nothing was written)"
        )

    def _parsed(self, content: bytes, endpoint: str):
        """An answer's JSON, bounded in values (a few KB of gzip can unpack to tens of MB
        of ``[],``, a gigabyte as Python objects) and depth; an answer cut short or not
        JSON raises ValueError (retried like a broken connection)."""
        if not content:
            return {}
        values = read.value_bound(content)
        if values > read.MAX_JSON_VALUES:
            raise InputError(
                f"{self.location}: {endpoint} answered with JSON of up to {values:,} values, "
                f"more than the {read.MAX_JSON_VALUES:,} audit reads from one answer; refused "
                "before it fills memory (lower [mlflow] page_size if the server is yours)"
            )
        try:
            return json.loads(content)
        except RecursionError:
            raise InputError(
                f"{self.location}: {endpoint} answered with JSON nested deeper than the "
                "~1,000 levels audit reads; is this an MLflow server?"
            ) from None

    def _exchange(self, method: str, url: str, payload: dict | None) -> tuple[int, bytes]:
        """One request within ``timeout`` seconds in all, at most ``max_response_bytes``."""
        arguments = {"params": payload} if method == "GET" else {"json": payload}
        for _ in range(MAX_REDIRECTS + 1):
            # redirects are followed here, not by requests: only to the same server, so
            # the credentials never travel elsewhere and a file:// target is named
            answer = http.exchange(
                self.session,
                method,
                url,
                self.timeout,
                self.max_response_bytes,
                allow_redirects=False,
                **arguments,
            )
            if answer.status not in (301, 302, 303, 307, 308):
                return answer.status, answer.body
            target = urljoin(url, answer.headers.get("Location", ""))
            _check_redirect(url, target)
            if answer.status == 303:
                method, arguments = "GET", {"params": payload}
            url = target
        raise _Redirected(f"redirected more than {MAX_REDIRECTS} times; not followed further")

    def _paged(self, method: str, endpoint: str, payload: dict, item_key: str) -> Iterator[dict]:
        token = None
        seen: set[str] = set()
        while True:
            body = self.call(
                method, endpoint, {**payload, **({"page_token": token} if token else {})}
            )
            yield from fields.items(body.get(item_key), f"{self.location}: {endpoint}", item_key)
            token = body.get("next_page_token")
            if not token:
                return
            if not isinstance(token, str):
                raise InputError(
                    f"{self.location}: {endpoint} answered next_page_token "
                    f"{fields.describe(token)}, not text"
                )
            if token in seen:
                raise SourceUnavailable(
                    f"{self.location}: {endpoint} returned a page token it had returned "
                    "before; the server pages in a loop (nothing was written)"
                )
            seen.add(token)

    # -- reading ---------------------------------------------------------------------------
    def experiments(self) -> pl.DataFrame:
        where = f"{self.location}: experiments/search"
        rows = [
            self._experiment_row(e, where)
            for e in self._paged(
                "POST",
                "experiments/search",
                {"max_results": self.page_size, "view_type": "ALL"},
                "experiments",
            )
        ]
        return frame(rows, EXPERIMENT_SCHEMA)

    def _experiment_row(self, e: dict, where: str, known_id: str | None = None) -> tuple:
        experiment_id = fields.text(e.get("experiment_id", known_id), where, "experiment_id")
        if not experiment_id:
            raise InputError(f"{where}: an experiment without experiment_id")
        where = f"{where} experiment {experiment_id}"
        return (
            experiment_id,
            fields.text(e.get("name"), where, "name"),
            fields.text(e.get("artifact_location"), where, "artifact_location"),
            fields.text(e.get("lifecycle_stage"), where, "lifecycle_stage"),
            fields.epoch_ms(e.get("creation_time"), where, "creation_time"),
            fields.epoch_ms(e.get("last_update_time"), where, "last_update_time"),
        )

    def runs(self, experiment_ids: list[str], known: KnownRuns | None = None) -> pl.DataFrame:
        """Every run of the experiments. MLflow builds a search page run by run in one
        worker, and the pages of one search follow each other; so the experiments are split
        into SEARCHES_AT_ONCE groups (at most SEARCH_EXPERIMENTS each, fewer if
        ``concurrency`` is 1) searched at the same time."""
        if not experiment_ids:
            experiment_ids = self.experiments()["experiment_id"].to_list()
        at_once = min(SEARCHES_AT_ONCE, self.concurrency)
        per_group = min(SEARCH_EXPERIMENTS, max(1, -(-len(experiment_ids) // at_once)))
        groups = [
            experiment_ids[start : start + per_group]
            for start in range(0, len(experiment_ids), per_group)
        ]
        with ThreadPoolExecutor(at_once) as pool:
            found = list(pool.map(self._search_runs, groups))
        return frame([row for rows in found for row in rows], RUN_SCHEMA)

    def _search_runs(self, experiment_ids: list[str]) -> list[tuple]:
        payload = {
            "experiment_ids": experiment_ids,
            "max_results": self.page_size,
            "run_view_type": "ALL",
        }
        where = f"{self.location}: runs/search"
        return [
            self._run_row(run, where) for run in self._paged("POST", "runs/search", payload, "runs")
        ]

    def _run_row(self, run: dict, where: str) -> tuple:
        """One run of runs/search or runs/get as a RUN_SCHEMA row; keeps it for details()."""
        info = fields.mapping(run.get("info"), where, "run info")
        run_id = fields.text(info.get("run_id") or info.get("run_uuid"), where, "run_id")
        if not run_id:
            raise InputError(f"{where}: a run without run_id")
        where = f"{where} run {run_id}"
        data = fields.mapping(run.get("data"), where, "run data")
        parsed = _RunDetails(
            params=[
                (
                    fields.key_of(p, where, "params"),
                    fields.text(p.get("value"), where, "param value"),
                )
                for p in fields.items(data.get("params"), where, "params")
            ],
            tags=[
                (fields.key_of(t, where, "tags"), fields.text(t.get("value"), where, "tag value"))
                for t in fields.items(data.get("tags"), where, "tags")
            ],
            metrics=[
                _metric(m, run_id, fields.key_of(m, where, "metrics"), where)
                for m in fields.items(data.get("metrics"), where, "metrics")
            ],
            datasets=_dataset_rows(run_id, run, where),
        )
        self._search_results[run_id] = parsed
        tags = dict(parsed.tags)
        row = (
            run_id,
            fields.text(info.get("experiment_id"), where, "experiment_id"),
            fields.text(info.get("run_name"), where, "run_name") or tags.get(RUN_NAME_TAG),
            fields.text(info.get("user_id"), where, "user_id"),
            fields.text(info.get("status"), where, "status"),
            fields.epoch_ms(info.get("start_time"), where, "start_time"),
            fields.epoch_ms(info.get("end_time"), where, "end_time"),
            fields.text(info.get("lifecycle_stage"), where, "lifecycle_stage"),
            None,
            fields.text(info.get("artifact_uri"), where, "artifact_uri"),
            tags.get("mlflow.source.name"),
            tags.get("mlflow.source.type"),
            tags.get(GIT_COMMIT_TAG),
        )
        signature = stable_hash(
            row,
            sorted(parsed.tags),
            sorted(parsed.params),
            sorted(map(repr, parsed.metrics)),
            parsed.datasets,
        )
        return (*row, signature)

    def fetch_run(self, run_id: str) -> pl.DataFrame:
        """One run through runs/get (a RUNNING run included), ready for details()."""
        where = f"{self.location}: runs/get"
        run = fields.mapping(
            self.call("GET", "runs/get", {"run_id": run_id}).get("run"), where, "run"
        )
        if not run:
            raise InputError(f"{self.location}: no run {run_id}")
        row = self._run_row(run, where)
        if row[0] != run_id:
            raise InputError(
                f"{where}: asked for run {run_id}, the server answered with run "
                f"{terminal_safe(row[0])}; refused"
            )
        return frame([row], RUN_SCHEMA)

    def experiment(self, experiment_id: str) -> pl.DataFrame:
        where = f"{self.location}: experiments/get"
        e = fields.mapping(
            self.call("GET", "experiments/get", {"experiment_id": experiment_id}).get("experiment"),
            where,
            "experiment",
        )
        return frame([self._experiment_row(e, where, experiment_id)], EXPERIMENT_SCHEMA)

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        """Batches of RUNS_PER_BATCH runs. The history requests of the next BATCHES_AHEAD
        batches are queued before a batch is handed over, so the server always has work
        while this side parses and the caller writes; ``concurrency`` bounds the requests
        under way."""
        chunks = (run_ids[i : i + RUNS_PER_BATCH] for i in range(0, len(run_ids), RUNS_PER_BATCH))
        pending: deque[tuple[list[str], list[Future]]] = deque()
        with ThreadPoolExecutor(self.concurrency) as pool:
            try:
                for chunk in chunks:
                    pending.append(
                        (
                            chunk,
                            [
                                pool.submit(self._histories, r)
                                for r in self._history_requests(chunk)
                            ],
                        )
                    )
                    if len(pending) > BATCHES_AHEAD:
                        yield self._batch(*pending.popleft())
                while pending:
                    yield self._batch(*pending.popleft())
            finally:  # an error or an abandoned import: drop what was queued
                for _chunk, futures in pending:
                    for future in futures:
                        future.cancel()

    def _history_requests(self, chunk: list[str]) -> list[tuple[str, list[str]]]:
        """(metric key, up to BULK_RUNS run ids) for every metric the runs logged."""
        runs_by_key: dict[str, list[str]] = {}
        for run_id in chunk:
            for metric in self._search_results[run_id].metrics:
                runs_by_key.setdefault(metric[1], []).append(run_id)
        return [
            (key, ids[i : i + BULK_RUNS])
            for key, ids in sorted(runs_by_key.items())
            for i in range(0, len(ids), BULK_RUNS)
        ]

    def _batch(self, chunk: list[str], futures: list[Future]) -> DetailBatch:
        params, tags, latest, datasets = [], [], [], []
        for run_id in chunk:
            run = self._search_results[run_id]
            params.extend((run_id, k, v) for k, v in run.params)
            tags.extend((run_id, k, v) for k, v in run.tags)
            latest.extend(run.metrics)
            datasets.extend(run.datasets)
        history: list[tuple] = []
        for future in futures:
            history.extend(future.result())
        return DetailBatch(
            run_count=len(chunk),
            params=frame(params, PARAM_SCHEMA),
            tags=frame(tags, TAG_SCHEMA),
            metrics=frame(history, METRIC_SCHEMA),
            latest_metrics=frame(latest, METRIC_SCHEMA),
            datasets=frame(datasets, DATASET_SCHEMA),
        )

    def _histories(self, key_and_runs: tuple[str, list[str]]) -> list[tuple]:
        """The whole history of one metric of several runs."""
        key, run_ids = key_and_runs
        if not self._bulk_history:
            return [p for run_id in run_ids for p in self._history((run_id, key))]
        where = f"{self.location}: metrics/get-history-bulk metric {key}"
        try:
            body = self.call(
                "GET",
                "metrics/get-history-bulk",
                {"run_id": run_ids, "metric_key": key, "max_results": BULK_POINTS},
                optional=True,
            )
        except _NotServed:
            self._bulk_history = False
            return [p for run_id in run_ids for p in self._history((run_id, key))]
        entries = fields.items(body.get("metrics"), where, "metrics")
        if len(entries) >= BULK_POINTS:  # perhaps cut at the limit: ask again in halves
            if len(run_ids) == 1:
                return self._history((run_ids[0], key))
            half = len(run_ids) // 2
            return self._histories((key, run_ids[:half])) + self._histories((key, run_ids[half:]))
        asked = set(run_ids)
        points = []
        for entry in entries:
            run_id = fields.text(entry.get("run_id"), where, "run_id")
            if run_id not in asked or entry.get("key", key) != key:
                raise InputError(
                    f"{where}: answered with a point of run {_server_text(str(run_id), 40)} "
                    f"metric {_server_text(str(entry.get('key')), 60)}, which was not asked for"
                )
            points.append(_metric(entry, run_id, key, where))
        return points

    def _history(self, run_and_key: tuple[str, str]) -> list[tuple]:
        run_id, key = run_and_key
        where = f"{self.location}: metrics/get-history run {run_id} metric {key}"
        return [
            _metric(m, run_id, key, where)
            for m in self._paged(
                "GET",
                "metrics/get-history",
                {"run_id": run_id, "metric_key": key, "max_results": HISTORY_PAGE},
                "metrics",
            )
        ]

    def model_versions(self) -> pl.DataFrame:
        where = f"{self.location}: model-versions/search"
        rows = []
        for v in self._paged(
            "GET", "model-versions/search", {"max_results": 200_000}, "model_versions"
        ):
            name = fields.text(v.get("name"), where, "name")
            at = f"{where} model {name}"
            rows.append(
                (
                    name,
                    fields.text(v.get("version"), at, "version"),
                    fields.text(v.get("run_id"), at, "run_id"),
                    fields.text(v.get("source"), at, "source"),
                    fields.text(v.get("status"), at, "status"),
                    fields.text(v.get("current_stage"), at, "current_stage"),
                    fields.epoch_ms(v.get("creation_timestamp"), at, "creation_timestamp"),
                )
            )
        return frame(rows, MODEL_VERSION_SCHEMA)


@dataclass
class _RunDetails:
    """What runs/search said about a run, checked, kept for details()."""

    params: list[tuple[str, str | None]]
    tags: list[tuple[str, str | None]]
    metrics: list[tuple]  # METRIC_SCHEMA rows: the latest values
    datasets: list[tuple]


def _metric(m: dict, run_id: str, key: str, where: str) -> tuple:
    """A metric entry as a METRIC_SCHEMA row. A missing value is NaN (MLflow omits it
    for NaN in some versions); anything else that is not a number is refused."""
    where = f"{where} metric {key}"
    value = m.get("value")
    return (
        run_id,
        key,
        float("nan") if value is None else fields.number(value, where, "value"),
        fields.integer(m.get("step"), where, "step") or 0,
        fields.epoch_ms(m.get("timestamp"), where, "timestamp"),
    )


def _dataset_rows(run_id: str, run: dict, where: str) -> list[tuple]:
    out = []
    inputs = fields.mapping(run.get("inputs"), where, "inputs")
    for item in fields.items(inputs.get("dataset_inputs"), where, "dataset_inputs"):
        dataset = fields.mapping(item.get("dataset"), where, "dataset")
        context = next(
            (
                fields.text(t.get("value"), where, "dataset input tag")
                for t in fields.items(item.get("tags"), where, "dataset input tags")
                if t.get("key") == "mlflow.data.context"
            ),
            None,
        )
        out.append(
            (
                run_id,
                *(
                    fields.text(dataset.get(f), where, f"dataset {f}")
                    for f in ("name", "digest", "source_type", "source")
                ),
                context,
            )
        )
    return out


def _check_redirect(url: str, target: str) -> None:
    """A redirect is followed only within the tracking server (same host and port; http
    to https allowed): credentials are sent to no other host, and nothing else is read."""
    here, there = urlsplit(url), urlsplit(target)
    shown = _server_text(redact_url(target), 120)
    if there.scheme not in ("http", "https"):
        raise _Redirected(
            f"redirected to a {_server_text(there.scheme, 20)}: URL ({shown}); refused: a "
            "tracking server answers over HTTP, and audit reads no other kind of address"
        )
    default = {"http": 80, "https": 443}
    same_host = (here.hostname or "").lower() == (there.hostname or "").lower()
    same_port = (here.port or default[here.scheme]) == (there.port or default[there.scheme])
    upgrade = here.scheme == "http" and there.scheme == "https" and there.port in (None, 443)
    if not same_host or not (same_port or upgrade):
        raise _Redirected(
            f"redirected to another server ({shown}); not followed, so the credentials go "
            "only to the tracking URI: pass that address as --tracking-uri if it is the server"
        )


def _server_text(value: object, limit: int) -> str:
    """Text a server sent, for a message: one line, bounded, control characters escaped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return terminal_safe(text[:limit] + ("…" if len(text) > limit else ""))
