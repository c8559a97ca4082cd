"""Run ids as people type them: whole, or shortened to a unique prefix as git shortens
commits. Every command that takes a run id (``runs compare``, ``runs similar --run``,
``gate`` and its ``--baseline``) resolves it here."""

from __future__ import annotations

from audit.errors import InputError

MIN_PREFIX = 4
CANDIDATES_SHOWN = 5


def resolve_run_id(wh, given: str, what: str = "run", hint: str = "") -> str:
    """The run id ``given`` names: itself when a run has it, else the one run id it is a
    prefix of (at least ``MIN_PREFIX`` characters). None or several is an ``InputError``
    (exit 2) that says so, listing the candidates; ``what`` names the run in it (``run``,
    ``baseline run``) and ``hint`` says what to do about an unknown one."""
    found = find_run_id(wh, given, what)
    if found is None:
        shortest = (
            f" (a prefix needs at least {MIN_PREFIX} characters)" if len(given) < MIN_PREFIX else ""
        )
        raise InputError(
            f"no {what} {given!r} in the warehouse{shortest}" + (f"; {hint}" if hint else "")
        )
    return found


def find_run_id(wh, given: str, what: str = "run") -> str | None:
    """``resolve_run_id`` that answers None for a run id the warehouse does not hold (one
    about to be fetched from its tracker); an ambiguous prefix is still an error."""
    if wh.scalar("SELECT count(*) FROM runs WHERE run_id = ?", [given]):
        return given
    if len(given) < MIN_PREFIX:
        return None
    matches = wh.con.execute(
        "SELECT run_id, any_value(name ORDER BY source_id) FROM runs "
        "WHERE starts_with(run_id, ?) GROUP BY run_id ORDER BY run_id LIMIT ?",
        [given, CANDIDATES_SHOWN + 1],
    ).fetchall()
    if len(matches) > 1:
        shown = ", ".join(
            f"{run_id} ({name})" if name else run_id for run_id, name in matches[:CANDIDATES_SHOWN]
        )
        more = ", ..." if len(matches) > CANDIDATES_SHOWN else ""
        raise InputError(
            f"{what} id prefix {given!r} is ambiguous: it starts {shown}{more}; give more "
            "characters"
        )
    return matches[0][0] if matches else None
