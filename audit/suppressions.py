"""What a user asked to keep quiet: ``[[suppress]]`` entries and the run tag ``audit.ignore``.

One decision for every reader: ``scan`` mutes the findings it covers, and ``prune`` keeps
the checkpoints of every CKP finding it covers, in its plan and again when applying it.

- A config entry covers a finding when its ``rule`` names the finding's code or family,
  or is a shell-style pattern of either (``*``, ``CKP*``), and its ``subject`` is ``*`` or
  a pattern matching one of the subject's values (run id, run name, folder, job id...).
- A run tag ``audit.ignore=CODE[,CODE]`` (``[attribution] ignore_tag``) covers that run's
  findings of those codes or families (patterns allowed as in ``rule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from audit.config import Config


def _covers(pattern: str, rule: str, family: str) -> bool:
    pattern = pattern.strip().upper()
    return any(fnmatchcase(code, pattern) for code in (rule, family) if code)


def _subject_matches(pattern: str, subject: dict) -> bool:
    return pattern == "*" or any(
        fnmatchcase(str(v), pattern) for v in subject.values() if v is not None
    )


@dataclass(frozen=True)
class Suppressions:
    tag_key: str
    # run id -> the codes, families or patterns its ignore tag names
    ignored_runs: dict[str, frozenset[str]]
    entries: tuple[dict, ...]

    @classmethod
    def load(cls, con, config: Config) -> Suppressions:
        tag = config.attribution.ignore_tag
        ignored: dict[str, set[str]] = {}
        for run_id, value in con.execute(
            "SELECT run_id, value FROM tags WHERE key = ? ORDER BY run_id", [tag]
        ).fetchall():
            codes = {c.strip().upper() for c in (value or "").split(",") if c.strip()}
            ignored.setdefault(run_id, set()).update(codes)
        return cls(
            tag,
            {run: frozenset(codes) for run, codes in ignored.items()},
            config.suppress,
        )

    def reason(self, rule: str, family: str, subject: dict) -> str | None:
        """Why a finding of ``rule`` (of ``family``) about ``subject`` is muted, or None."""
        run_id = subject.get("run_id")
        codes = self.ignored_runs.get(run_id) if run_id else None
        if codes and any(_covers(code, rule, family) for code in codes):
            return f"run tag {self.tag_key}={','.join(sorted(codes))}"
        for entry in self.entries:
            if _covers(entry["rule"], rule, family) and _subject_matches(entry["subject"], subject):
                return f"config: {entry['reason']}"
        return None

    def covers_any(self, rules: tuple[str, ...], family: str, subject: dict) -> str | None:
        """The first reason any of ``rules`` about ``subject`` would be muted."""
        for rule in rules:
            found = self.reason(rule, family, subject)
            if found:
                return found
        return None
