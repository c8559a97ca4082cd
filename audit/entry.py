"""Process entry point: Ctrl-C at any moment ends with one line and exit code 130."""

from __future__ import annotations

import gc
import os
import sys

from audit import interrupts

# The commands build and drop millions of acyclic rows (tuples, dicts, dataclasses of
# runs and jobs) and then exit. With CPython's default thresholds (700, 10, 10) the cyclic
# collector ran 17 full passes over that heap in one scan at 100,000 runs: 12 of its 60 s.
# A larger young generation and rare full passes keep cycles collected at a fraction of it.
GC_THRESHOLDS = (50_000, 20, 100)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    interrupts.install()
    try:
        from audit.cli import cli
    except KeyboardInterrupt:
        print(interrupts.message(), file=sys.stderr)
        _exit_interrupted()
    try:
        cli.main(prog_name="audit", windows_expand_args=False)
    finally:
        interrupts.ignore_from_now_on()
        if interrupts.requested():
            _exit_interrupted()
        # The command is done and its warehouse closed; what is left is interpreter
        # teardown, whose cyclic collections walk every object of polars', DuckDB's and
        # pyarrow's module graphs: 70-130 ms of each command (a fifteenth of an
        # incremental import), 15-20 ms with those objects frozen out of the collector.
        # Objects still reachable are freed by reference counting as modules unload.
        gc.freeze()


def _exit_interrupted() -> None:
    # Not sys.exit: when the signal landed inside code an extension ran through
    # PyRun_String (module imports do), CPython marks the KeyboardInterrupt unhandled,
    # however it was caught, and would end the process by SIGINT instead of the code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(interrupts.exit_code())
