"""Reading a W&B log's records in chunks and decoding them: in this process for a small
log, by two worker processes for a large one (decoding is Python-bound), at most four
chunks in flight."""

from __future__ import annotations

import collections
import multiprocessing
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from audit.importers.record_log import LogEnd
from audit.importers.wandb.decode import Decoded, decode, worker_record_class
from audit.importers.wandb.log import read_log

# Logs with more unread bytes than this are decoded by two worker processes (decoding is
# Python-bound: one process uses one core); smaller ones in-process, where starting the
# workers would cost more than it saves.
PARALLEL_BYTES = 32 * 2**20
_RECORDS_PER_CHUNK = 4000


def _worker_start() -> None:
    # Ctrl-C is the parent's to handle: it rolls the import back and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker_record_class()


def _chunks(path: Path, start: int, end: LogEnd) -> Iterator[tuple[list[bytes], list[int]]]:
    payloads: list[bytes] = []
    offsets: list[int] = []
    for payload in read_log(path, start, end):
        payloads.append(payload)
        offsets.append(end.record_at)
        if len(payloads) >= _RECORDS_PER_CHUNK:
            yield payloads, offsets
            payloads, offsets = [], []
    if payloads:
        yield payloads, offsets


def decoded_chunks(path: Path, record_class, start: int, end: LogEnd) -> Iterator[Decoded]:
    if path.stat().st_size - start <= PARALLEL_BYTES:
        for payloads, offsets in _chunks(path, start, end):
            yield decode(path, payloads, offsets, record_class)
        return
    context = multiprocessing.get_context("spawn")  # polars' thread pool does not survive fork
    with ProcessPoolExecutor(2, mp_context=context, initializer=_worker_start) as pool:
        pending: collections.deque = collections.deque()
        try:
            for payloads, offsets in _chunks(path, start, end):
                pending.append(pool.submit(decode, path, payloads, offsets))
                while len(pending) >= 4:  # bounded: at most four chunks in flight
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
