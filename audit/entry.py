"""Process entry point: Ctrl-C at any moment ends with one line and exit code 130."""

from __future__ import annotations

import os
import sys

from audit import interrupts


def main() -> None:
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


def _exit_interrupted() -> None:
    # Not sys.exit: when the signal landed inside code an extension ran through
    # PyRun_String (module imports do), CPython marks the KeyboardInterrupt unhandled,
    # however it was caught, and would end the process by SIGINT instead of the code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(interrupts.EXIT_INTERRUPTED)
