"""Run the tool on each real data set as a user would, and score it against the verdicts.

Every data set of ``verdicts.yml`` is imported into a warehouse of its own through the real
CLI, scanned over its whole history, and each verdict is matched against the findings.
Precision (of the findings a verdict judges: those matching an ``expect`` are right, those
matching a ``must_not`` wrong; the others are not judged and counted apart) and recall (the
share of ``expect`` verdicts met) are given per rule family and per data set.
"""

from __future__ import annotations

import json
import shlex
import tarfile
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

import yaml
from click.testing import CliRunner

from audit.cli import cli

HERE = Path(__file__).resolve().parent
SEVERITIES = ("info", "low", "medium", "high", "critical")


@dataclass
class Outcome:
    dataset: str
    verdict: dict
    matches: list[dict]

    @property
    def kind(self) -> str:
        return self.verdict["kind"]

    @property
    def met(self) -> bool:
        return bool(self.matches)

    @property
    def failed(self) -> bool:
        """A must_not that fired, an expect missed that is not a known miss, or a known
        miss that is met (its mark is stale)."""
        if self.kind == "must_not":
            return self.met
        if self.kind == "expect":
            return self.met == bool(self.verdict.get("known_miss"))
        return False


@dataclass
class DataSetResult:
    name: str
    findings: list[dict]
    outcomes: list[Outcome] = field(default_factory=list)
    error: str | None = None


def load_verdicts(path: Path = HERE / "verdicts.yml") -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["datasets"]


def matches(verdict: dict, finding: dict) -> bool:
    if not fnmatchcase(finding["rule"], verdict.get("rule", "*")):
        return False
    for key, pattern in (verdict.get("subject") or {}).items():
        value = finding["subject"].get(key)
        if value is None or not fnmatchcase(str(value), str(pattern)):
            return False
    if not all(text in finding["message"] for text in verdict.get("message", [])):
        return False
    evidence = json.dumps(finding["evidence"], ensure_ascii=False, default=str)
    if not all(text in evidence for text in verdict.get("evidence", [])):
        return False
    if "listed" in verdict and finding.get("material", True) != verdict["listed"]:
        return False
    rank = SEVERITIES.index(finding["severity"])
    if "min_severity" in verdict and rank < SEVERITIES.index(verdict["min_severity"]):
        return False
    if "max_severity" in verdict and rank > SEVERITIES.index(verdict["max_severity"]):
        return False
    for name, (low, high) in (verdict.get("waste") or {}).items():
        value = finding["waste"].get(name)
        if value is None or not low <= value <= high:
            return False
    return True


def run_dataset(spec: dict, realdata: Path, work: Path) -> DataSetResult:
    """Import one data set through the CLI, scan it, and match its verdicts."""
    work.mkdir(parents=True, exist_ok=True)
    db = work / "audit.duckdb"
    base = ["--db", str(db)]
    if not spec["commands"] or all(isinstance(c, dict) and "id" in c for c in spec["commands"]):
        # only refusals: an empty warehouse to scan all the same
        from audit.warehouse import open_warehouse

        with open_warehouse(db, create=True):
            pass
    if spec.get("config"):
        (work / "audit.toml").write_text(spec["config"], encoding="utf-8")
        base += ["--config", str(work / "audit.toml")]
    if spec.get("unpack"):
        with tarfile.open(realdata / spec["unpack"]) as archive:
            archive.extractall(work, filter="data")
    runner = CliRunner()
    refusals: list[Outcome] = []
    for command in spec["commands"]:
        # a command is a list of arguments, or {args, exit, output, id, why}: a refusal the
        # verdicts expect (an expect verdict met when it exits so, saying so)
        expected = command if isinstance(command, dict) else {"args": command, "exit": 0}
        args = [a.format(realdata=realdata, work=work) for a in expected["args"]]
        result = runner.invoke(cli, base + args)
        said = result.output  # stdout and stderr as a terminal shows them
        if "id" in expected:
            met = result.exit_code == expected["exit"] and all(
                text in said for text in expected.get("output", [])
            )
            verdict = {"kind": "expect", "family": "IMPORT", **expected}
            refusals.append(
                Outcome(spec["name"], verdict, [{"exit": result.exit_code}] if met else [])
            )
            continue
        if result.exit_code != expected["exit"]:
            return DataSetResult(
                spec["name"],
                [],
                error=f"audit {shlex.join(args)}: exit {result.exit_code}: {said[-500:]}",
            )
    result = runner.invoke(cli, [*base, "scan", "--format", "json"])
    if result.exit_code not in (0, 1):
        return DataSetResult(spec["name"], [], error=f"scan: exit {result.exit_code}")
    findings = [f for f in json.loads(result.stdout)["findings"] if not f["suppressed"]]
    out = DataSetResult(spec["name"], findings, refusals)
    for verdict in spec.get("verdicts", []):
        out.outcomes.append(
            Outcome(spec["name"], verdict, [f for f in findings if matches(verdict, f)])
        )
    return out


def run_all(realdata: Path, work: Path, only: str | None = None) -> list[DataSetResult]:
    return [
        run_dataset(spec, realdata, work / spec["name"].replace("/", "_"))
        for spec in load_verdicts()
        if only is None or fnmatchcase(spec["name"], only)
    ]


@dataclass
class Score:
    right: int = 0  # findings matching an expect
    wrong: int = 0  # findings matching a must_not
    unjudged: int = 0  # findings no verdict judges
    expected: int = 0
    met: int = 0

    def add(self, other: Score) -> None:
        for name in ("right", "wrong", "unjudged", "expected", "met"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def precision(self) -> float | None:
        judged = self.right + self.wrong
        return self.right / judged if judged else None

    @property
    def recall(self) -> float | None:
        return self.met / self.expected if self.expected else None


def scores(results: list[DataSetResult]) -> tuple[dict[str, Score], dict[str, Score]]:
    """(per family, per data set) scores."""
    by_family: dict[str, Score] = {}
    by_dataset: dict[str, Score] = {}
    for result in results:
        mine = by_dataset.setdefault(result.name, Score())
        right_ids = {id(f) for o in result.outcomes if o.kind == "expect" for f in o.matches}
        wrong_ids = {id(f) for o in result.outcomes if o.kind == "must_not" for f in o.matches}
        for finding in result.findings:
            family = finding["rule"][:3]
            score = by_family.setdefault(family, Score())
            if id(finding) in wrong_ids:
                score.wrong += 1
                mine.wrong += 1
            elif id(finding) in right_ids:
                score.right += 1
                mine.right += 1
            else:
                score.unjudged += 1
                mine.unjudged += 1
        for outcome in result.outcomes:
            if outcome.kind != "expect":
                continue
            family = outcome.verdict["family"]
            score = by_family.setdefault(family, Score())
            score.expected += 1
            mine.expected += 1
            if outcome.met:
                score.met += 1
                mine.met += 1
    return dict(sorted(by_family.items())), by_dataset


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f} %"


def table(results: list[DataSetResult]) -> str:
    by_family, by_dataset = scores(results)
    total = Score()
    for score in by_dataset.values():
        total.add(score)
    lines = []

    def block(title: str, rows: dict[str, Score]) -> None:
        lines.append(
            f"{title:<44} {'precision':>9} {'recall':>7}  right wrong unjudged  expected met"
        )
        for name, s in rows.items():
            lines.append(
                f"{name:<44} {_pct(s.precision):>9} {_pct(s.recall):>7}  {s.right:>5} "
                f"{s.wrong:>5} {s.unjudged:>8}  {s.expected:>8} {s.met:>3}"
            )
        lines.append("")

    block("family", by_family)
    block("data set", {**by_dataset, "all": total})
    for result in results:
        if result.error:
            lines.append(f"{result.name}: ERROR {result.error}")
        for outcome in result.outcomes:
            v = outcome.verdict
            if outcome.kind == "expect" and not outcome.met:
                reason = v.get("known_miss") or "NOT a known miss"
                lines.append(f"missed   {result.name} {v['id']}: {v['why']} [{reason}]")
            elif outcome.kind == "must_not" and outcome.met:
                shown = "; ".join(f"{f['rule']} {f['message'][:80]}" for f in outcome.matches[:2])
                lines.append(f"WRONG    {result.name} {v['id']}: {v['why']} — {shown}")
            elif outcome.kind == "soft":
                state = "found" if outcome.met else "not found"
                lines.append(f"soft     {result.name} {v['id']} ({state}): {v['why']}")
    return "\n".join(lines)
