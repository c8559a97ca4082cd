"""`audit ingest acme`: runs of the in-house tracker ACME, one JSON file per run.

A file ``<run>.acme.json``: {"run": id, "project": name, "status": "FINISHED", "config":
{...}, "loss": [value per step], "started": epoch seconds, "ended": epoch seconds}.
"""

from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers.files import ParsedUnit
from audit.importers.read import parse_json
from audit.importers.run_files import POINT_SCHEMA, ParsedRun, RunFolderSource
from audit.importers.store_files import read_found_file


class AcmeSource(RunFolderSource):
    kind = "acme"
    noun = "run"
    unit = "file"
    read_what = "file"
    progress_label = "importing ACME runs"
    command_help = """Import ACME run files (<run>.acme.json).

    \b
    Example:
      audit ingest acme /scratch/acme-runs
    """

    def units(self, paths: list[Path]) -> list[Path]:
        files = [
            p for path in paths for p in (path.glob("*.acme.json") if path.is_dir() else [path])
        ]
        if not files:
            raise InputError(f"{', '.join(map(str, paths))}: no *.acme.json file")
        return sorted(files)

    def parse(self, unit: Path) -> ParsedUnit:
        stat = unit.stat()
        signature = f"{stat.st_size}:{stat.st_mtime_ns}"
        data = parse_json(read_found_file(unit, 16 << 20, "an ACME run file"), unit)
        if not isinstance(data, dict) or not isinstance(data.get("run"), str):
            raise InputError(f"{unit}: not an ACME run file (no run id)")
        run_id, project = data["run"], str(data.get("project", unit.parent.name))
        if self.known_signature(unit.parent, run_id) == signature:
            return ParsedUnit(ParsedRun(unit.parent, run_id, project, signature, unchanged=True), 0)
        loss = [float(v) for v in data.get("loss", [])]
        run = ParsedRun(
            source_dir=unit.parent,
            run_id=run_id,
            experiment=project,
            signature=signature,
            name=data.get("name", run_id),
            status=data.get("status"),
            start_ms=round(data["started"] * 1000) if "started" in data else None,
            end_ms=round(data["ended"] * 1000) if "ended" in data else None,
            params={k: str(v) for k, v in data.get("config", {}).items()},
            points=pl.DataFrame(
                {"key": ["loss"] * len(loss), "value": loss, "step": list(range(len(loss)))},
                schema={k: v for k, v in POINT_SCHEMA.items() if k != "timestamp"},
            ).with_columns(timestamp=pl.lit(None, pl.Int64)),
        )
        return ParsedUnit(run, rows_read=1)
