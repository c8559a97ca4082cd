"""Reading a running MLflow tracking server through its documented REST API.

Runs come from ``runs/search`` with large pages (params, tags and latest metrics included);
metric histories only for new or changed runs, fetched concurrently. Transient failures
(5xx, 429, resets, timeouts, truncated bodies) are retried with exponential backoff, then
end in ``SourceUnavailable``. Credentials come from the URI or MLflow's environment
variables and are never part of ``location``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import polars as pl
import requests

from audit.errors import InputError, SourceUnavailable
from audit.importers.mlflow.base import (
    GIT_COMMIT_TAG,
    MODEL_VERSION_SCHEMA,
    RUN_NAME_TAG,
    to_int,
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

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
HISTORY_PAGE = 25_000
RUNS_PER_BATCH = 500
HISTORY_WORKERS = 8


def redact_url(uri: str) -> str:
    """The URI without user, password or query string (tokens sometimes travel there)."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class RestReader:
    kind = "http"

    def __init__(
        self,
        uri: str,
        timeout: float = 30.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        page_size: int = 1000,
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
        self.session = requests.Session()
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

    def close(self) -> None:
        self.session.close()

    # -- transport -------------------------------------------------------------------------
    def call(self, method: str, endpoint: str, payload: dict | None = None) -> dict:
        url = f"{self.base}/api/2.0/mlflow/{endpoint}"
        last_problem = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                if method == "GET":
                    response = self.session.get(url, params=payload, timeout=self.timeout)
                else:
                    response = self.session.post(url, json=payload, timeout=self.timeout)
                if response.status_code in RETRYABLE_STATUS:
                    last_problem = f"HTTP {response.status_code}"
                    continue
                body = response.json() if response.content else {}
            except (requests.ConnectionError, requests.Timeout) as exc:
                last_problem = type(exc).__name__
                continue
            except (requests.exceptions.ChunkedEncodingError, ValueError):
                last_problem = "truncated or non-JSON response"
                continue
            if response.status_code in (401, 403):
                raise SourceUnavailable(
                    f"{self.location}: access denied (HTTP {response.status_code}); set "
                    "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD"
                )
            if response.status_code >= 400:
                code = body.get("error_code", "") if isinstance(body, dict) else ""
                message = body.get("message", "") if isinstance(body, dict) else ""
                raise SourceUnavailable(
                    f"{self.location}: {endpoint} failed with HTTP {response.status_code} "
                    f"{code}: {message[:200]}".rstrip(": ")
                )
            return body
        raise SourceUnavailable(
            f"{self.location}: {endpoint} still failing after {self.max_retries + 1} attempts "
            f"({last_problem}); check the server and retry the import (nothing was written)"
        )

    def _paged(self, method: str, endpoint: str, payload: dict, item_key: str) -> Iterator[dict]:
        token = None
        while True:
            body = self.call(
                method, endpoint, {**payload, **({"page_token": token} if token else {})}
            )
            yield from body.get(item_key, [])
            token = body.get("next_page_token")
            if not token:
                return

    # -- reading ---------------------------------------------------------------------------
    def experiments(self) -> pl.DataFrame:
        rows = [
            (
                str(e["experiment_id"]),
                e.get("name"),
                e.get("artifact_location"),
                e.get("lifecycle_stage"),
                to_int(e.get("creation_time")),
                to_int(e.get("last_update_time")),
            )
            for e in self._paged(
                "POST",
                "experiments/search",
                {"max_results": self.page_size, "view_type": "ALL"},
                "experiments",
            )
        ]
        return frame(rows, EXPERIMENT_SCHEMA)

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame:
        if not experiment_ids:
            experiment_ids = self.experiments()["experiment_id"].to_list()
        rows = []
        for start in range(0, len(experiment_ids), 100):
            payload = {
                "experiment_ids": experiment_ids[start : start + 100],
                "max_results": self.page_size,
                "run_view_type": "ALL",
            }
            for run in self._paged("POST", "runs/search", payload, "runs"):
                rows.append(self._run_row(run))
        return frame(rows, RUN_SCHEMA)

    def _run_row(self, run: dict) -> tuple:
        """One run of runs/search or runs/get as a RUN_SCHEMA row; keeps it for details()."""
        info, data = run.get("info", {}), run.get("data", {})
        run_id = info.get("run_id") or info.get("run_uuid")
        self._search_results[run_id] = run
        tags = {t["key"]: t.get("value") for t in data.get("tags", [])}
        signature = stable_hash(
            info.get("status"),
            info.get("end_time"),
            info.get("lifecycle_stage"),
            info.get("run_name"),
            sorted(tags.items()),
            sorted((p["key"], p.get("value")) for p in data.get("params", [])),
            sorted(
                (m["key"], str(m.get("value")), m.get("timestamp"), m.get("step"))
                for m in data.get("metrics", [])
            ),
            _dataset_rows(run_id, run),
        )
        return (
            run_id,
            str(info.get("experiment_id")),
            info.get("run_name") or tags.get(RUN_NAME_TAG),
            info.get("user_id"),
            info.get("status"),
            to_int(info.get("start_time")),
            to_int(info.get("end_time")),
            info.get("lifecycle_stage"),
            None,
            info.get("artifact_uri"),
            tags.get("mlflow.source.name"),
            tags.get("mlflow.source.type"),
            tags.get(GIT_COMMIT_TAG),
            signature,
        )

    def fetch_run(self, run_id: str) -> pl.DataFrame:
        """One run through runs/get (a RUNNING run included), ready for details()."""
        run = self.call("GET", "runs/get", {"run_id": run_id}).get("run")
        if not run:
            raise InputError(f"{self.location}: no run {run_id}")
        return frame([self._run_row(run)], RUN_SCHEMA)

    def experiment(self, experiment_id: str) -> pl.DataFrame:
        e = self.call("GET", "experiments/get", {"experiment_id": experiment_id}).get(
            "experiment", {}
        )
        return frame(
            [
                (
                    str(e.get("experiment_id", experiment_id)),
                    e.get("name"),
                    e.get("artifact_location"),
                    e.get("lifecycle_stage"),
                    to_int(e.get("creation_time")),
                    to_int(e.get("last_update_time")),
                )
            ],
            EXPERIMENT_SCHEMA,
        )

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        with ThreadPoolExecutor(HISTORY_WORKERS) as pool:
            for start in range(0, len(run_ids), RUNS_PER_BATCH):
                chunk = run_ids[start : start + RUNS_PER_BATCH]
                params, tags, latest, datasets, wanted = [], [], [], [], []
                for run_id in chunk:
                    run = self._search_results[run_id]
                    data = run.get("data", {})
                    params.extend(
                        (run_id, p["key"], p.get("value")) for p in data.get("params", [])
                    )
                    tags.extend((run_id, t["key"], t.get("value")) for t in data.get("tags", []))
                    for m in data.get("metrics", []):
                        latest.append(
                            (
                                run_id,
                                m["key"],
                                _float(m.get("value")),
                                to_int(m.get("step")) or 0,
                                to_int(m.get("timestamp")),
                            )
                        )
                        wanted.append((run_id, m["key"]))
                    datasets.extend(_dataset_rows(run_id, run))
                history: list[tuple] = []
                for points in pool.map(self._history, wanted):
                    history.extend(points)
                yield DetailBatch(
                    run_count=len(chunk),
                    params=frame(params, PARAM_SCHEMA),
                    tags=frame(tags, TAG_SCHEMA),
                    metrics=frame(history, METRIC_SCHEMA),
                    latest_metrics=frame(latest, METRIC_SCHEMA),
                    datasets=frame(datasets, DATASET_SCHEMA),
                )

    def _history(self, run_and_key: tuple[str, str]) -> list[tuple]:
        run_id, key = run_and_key
        return [
            (
                run_id,
                key,
                _float(m.get("value")),
                to_int(m.get("step")) or 0,
                to_int(m.get("timestamp")),
            )
            for m in self._paged(
                "GET",
                "metrics/get-history",
                {"run_id": run_id, "metric_key": key, "max_results": HISTORY_PAGE},
                "metrics",
            )
        ]

    def model_versions(self) -> pl.DataFrame:
        rows = [
            (
                v.get("name"),
                str(v.get("version")),
                v.get("run_id"),
                v.get("source"),
                v.get("status"),
                v.get("current_stage"),
                to_int(v.get("creation_timestamp")),
            )
            for v in self._paged(
                "GET", "model-versions/search", {"max_results": 200_000}, "model_versions"
            )
        ]
        return frame(rows, MODEL_VERSION_SCHEMA)


def _dataset_rows(run_id: str, run: dict) -> list[tuple]:
    out = []
    for item in (run.get("inputs") or {}).get("dataset_inputs", []):
        dataset = item.get("dataset", {})
        context = next(
            (t.get("value") for t in item.get("tags", []) if t.get("key") == "mlflow.data.context"),
            None,
        )
        out.append(
            (
                run_id,
                dataset.get("name"),
                dataset.get("digest"),
                dataset.get("source_type"),
                dataset.get("source"),
                context,
            )
        )
    return out


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
