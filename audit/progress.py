"""A progress bar on a terminal, nothing otherwise (cron, CI, pipes)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress


class ProgressReporter:
    """Counts units done out of a total; draws a bar only when stderr is a terminal."""

    def __init__(self, label: str, enabled: bool | None = None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Progress | None = None
        self._task = None

    def start(self, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        # rich only when a bar is drawn: its import is a tenth of a second of every start
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.label, total=total)

    def advance(self, amount: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, amount)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class NoProgress(ProgressReporter):
    def __init__(self) -> None:
        super().__init__("", enabled=False)
