"""``make accuracy``: the accuracy table against the expert verdicts on ../shared/realdata.

python -m tests.accuracy [--only GLOB] [--realdata PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.accuracy.harness import run_all, table
from tests.helpers import SHARED


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.accuracy")
    parser.add_argument("--only", help="data sets whose name matches this glob")
    parser.add_argument("--realdata", type=Path, default=SHARED)
    args = parser.parse_args()
    if not args.realdata.is_dir():
        print(f"no real data at {args.realdata}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="audit-accuracy-") as work:
        results = run_all(args.realdata, Path(work), args.only)
    print(table(results))
    failed = [o for r in results for o in r.outcomes if o.failed] or [r for r in results if r.error]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
