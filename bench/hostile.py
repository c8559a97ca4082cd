"""Issue 40's hostile inputs on two checkouts: exit code, time and peak memory of each.

    python -m bench.hostile --before /path/to/old/checkout [--after .] [--only TEXT]

Each case of ``tests/hostile_cases.py`` is built in a fresh folder and run by each
checkout's own ``audit`` (``python -m audit`` from that folder), bounded in time and
address space as the tests bound it; peak memory is the command's own (``wait4``).
Prints a Markdown table: per case, before and after, and whether the case holds.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests import hostile_cases


def _cell(outcome: hostile_cases.Outcome) -> str:
    code = "timeout" if outcome.timed_out else str(outcome.code)
    return f"{code} · {outcome.seconds:.1f} s · {outcome.max_rss / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout before the change")
    parser.add_argument("--after", type=Path, default=Path("."), help="checkout after it")
    parser.add_argument("--only", default="", help="cases whose name holds this text")
    args = parser.parse_args()
    print("| case | before: exit · time · peak RSS | after | holds before / after |")
    print("|---|---|---|---|")
    for case in hostile_cases.CASES:
        if args.only not in case.name or not hostile_cases.available(case):
            continue
        cells, holds = [], []
        for checkout in (args.before, args.after):
            with tempfile.TemporaryDirectory(prefix="audit-hostile-") as folder:
                outcome = hostile_cases.run_case(case, Path(folder), cwd=checkout.resolve())
                problems = hostile_cases.verdict(case, outcome, Path(folder) / "audit.duckdb")
            cells.append(_cell(outcome))
            holds.append("no" if problems else "yes")
        print(f"| {case.name} | {cells[0]} | {cells[1]} | {' / '.join(holds)} |", flush=True)


if __name__ == "__main__":
    main()
