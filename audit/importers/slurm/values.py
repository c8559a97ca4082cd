"""Slurm's field values as ``sacct -P`` prints them: host lists, TRES lists, memory sizes,
durations, times, whole numbers; each bounded by what its column and Slurm can hold, a
value beyond it a ``LineError`` the reader names with file and line."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_NO_TIME = {"", "unknown", "none", "n/a"}
NO_LIMIT = {"unlimited", "partition_limit", "invalid", ""}
_DURATION = re.compile(r"^(?:(\d{1,9})-)?(?:(\d{1,9}):)?(\d{1,9}):(\d{1,9}(?:\.\d{1,9})?)$")
_MEMORY = re.compile(r"^(\d{1,20}(?:\.\d{1,9})?)([KMGTP]?)([nc]?)$", re.IGNORECASE)
_WHOLE = re.compile(r"^\+?(\d{1,20})(?:\.0*)?$")
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Slurm keeps elapsed seconds and time limits in minutes as 32-bit counts.
UINT32_MAX = 2**32 - 1
MAX_HOSTS = 100_000  # more hosts than the largest cluster has, in one node list
FIRST_YEAR, LAST_YEAR = 1970, 2200


class LineError(ValueError):
    """A field that cannot be parsed; the reader adds file and line."""


def parse_hostlist(expression: str) -> list[str]:
    """Expand Slurm hostlist syntax: ``gpu-a[01-03,07]``, ``n[1-2]-ib``, ``a1,b[2-3]``.

    The number of hosts is counted before anything is expanded: each bracket is bounded,
    and so is their product (``n[0-99999][0-99999]`` names 10^10 hosts).
    """
    text_ = expression.strip()
    if not text_ or text_.lower() in ("none assigned", "(null)", "none"):
        return []
    parts = _split_top_level(text_)
    total = sum(_host_count(part) for part in parts)
    if total > MAX_HOSTS:
        raise LineError(
            f"node list {text_[:60]!r} names {total:,} hosts, more than the {MAX_HOSTS:,} "
            "a node list may hold"
        )
    hosts: list[str] = []
    for part in parts:
        hosts.extend(_expand(part))
    return hosts


def _split_top_level(text_: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text_:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LineError(f"unbalanced ']' in node list {text_[:60]!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise LineError(f"unbalanced '[' in node list {text_[:60]!r}")
    parts.append("".join(current))
    return [p for p in parts if p]


def _bracket_items(pattern: str, items: str) -> list[tuple[int, int, int] | str]:
    """``01-03,07`` -> [(1, 3, 2), '07']: ranges as (low, high, zero-padded width)."""
    out: list[tuple[int, int, int] | str] = []
    for item in items.split(","):
        if "-" in item:
            lo, hi = item.split("-", 1)
            if (
                not (lo.isdigit() and hi.isdigit() and len(lo) <= 12 and len(hi) <= 12)
                or int(hi) < int(lo)
                or int(hi) - int(lo) > MAX_HOSTS
            ):
                raise LineError(f"bad range {item[:40]!r} in node list {pattern[:60]!r}")
            out.append((int(lo), int(hi), len(lo)))
        elif not item:
            raise LineError(f"empty item in node list {pattern[:60]!r}")
        else:
            out.append(item)
    return out


def _host_count(pattern: str) -> int:
    count = 1
    for match in re.finditer(r"\[([^\]]*)\]", pattern):
        items = _bracket_items(pattern, match.group(1))
        count *= sum(i[1] - i[0] + 1 if isinstance(i, tuple) else 1 for i in items)
        if count > MAX_HOSTS:
            return count
    return count


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    out = []
    for item in _bracket_items(pattern, match.group(1)):
        if isinstance(item, tuple):
            lo, hi, width = item
            values = [str(n).zfill(width) for n in range(lo, hi + 1)]
        else:
            values = [item]
        for value in values:
            out.extend(_expand(f"{head}{value}{tail}"))
    return out


def parse_tres(text_: str) -> dict[str, str]:
    """``billing=8,cpu=8,gres/gpu:v100=1,gres/gpu=1,mem=10G`` -> dict."""
    out = {}
    for item in text_.split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise LineError(f"expected key=value in TRES {text_[:80]!r}")
        out[key.strip()] = value.strip()
    return out


def gpus_from_tres(tres: dict[str, str]) -> tuple[int | None, str | None]:
    """GPU count from the bare ``gres/gpu=`` entry, type from a typed ``gres/gpu:TYPE=`` one.

    Sites list both (``gres/gpu:h100=8,gres/gpu=8``); counting both would double the GPUs,
    so typed entries are summed only when the bare one is missing.
    """
    typed = {
        k.split(":", 1)[1].split("(")[0]: v for k, v in tres.items() if k.startswith("gres/gpu:")
    }
    gpu_type = next(iter(typed), None)
    if "gres/gpu" in tres:
        return whole_number(tres["gres/gpu"], "gres/gpu"), gpu_type
    if typed:
        total = sum(whole_number(v, "gres/gpu") for v in typed.values())
        if total > INT32_MAX:
            raise LineError(f"gres/gpu: {total} GPUs is out of range")
        return total, gpu_type
    return None, None


def parse_memory(text_: str, field_name: str = "memory") -> int | None:
    """``10G``, ``1294440K``, ``125000M``, ``4000Mc`` (per CPU) -> bytes (per node as written)."""
    text_ = text_.strip()
    if not text_ or text_ in ("0", "0n", "0c"):
        return 0 if text_ else None
    match = _MEMORY.match(text_)
    if not match:
        raise LineError(f"{field_name}: expected a size like 10G or 4000Mc, got {text_[:40]!r}")
    number, unit, _per = match.groups()
    size = int(float(number) * _UNITS[unit.upper()])
    if size > INT64_MAX:
        raise LineError(f"{field_name}: {text_[:40]} is out of range (more than 8 EiB)")
    return size


def parse_duration(text_: str, field_name: str) -> int | None:
    """``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS.mmm`` -> seconds; UNLIMITED and friends -> None."""
    text_ = text_.strip()
    if text_.lower() in NO_LIMIT:
        return None
    match = _DURATION.match(text_)
    if not match:
        raise LineError(
            f"{field_name}: expected D-HH:MM:SS, HH:MM:SS or MM:SS.mmm, got {text_[:40]!r}"
        )
    days, a, b, c = match.groups()
    if a is None:  # MM:SS(.mmm)
        hours, minutes, seconds = 0, int(b), float(c)
    else:
        hours, minutes, seconds = int(a), int(b), float(c)
    total = round(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)
    if total > UINT32_MAX:
        raise LineError(f"{field_name}: {text_[:40]} is out of range (more than 136 years)")
    return total


def parse_time(text_: str, tz: ZoneInfo, field_name: str) -> datetime | None:
    """A naive sacct time in ``tz`` -> naive UTC; Unknown/None -> None. A time that occurs
    twice (the hour repeated when daylight saving time ends) is read as the first one."""
    moments = local_times(text_, tz, field_name)
    return moments[0] if moments else None


def local_times(text_: str, tz: ZoneInfo, field_name: str) -> list[datetime]:
    """The UTC readings of a sacct time: none (unknown), one, or two for a naive time in
    the repeated hour at the end of daylight saving time (earlier reading first)."""
    text_ = text_.strip()
    if text_.lower() in _NO_TIME:
        return []
    try:
        moment = datetime.fromisoformat(text_)
    except ValueError:
        raise LineError(
            f"{field_name}: expected a time like 2024-04-04T19:29:45, got {text_[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        candidates = [moment.replace(tzinfo=tz, fold=0), moment.replace(tzinfo=tz, fold=1)]
    else:
        candidates = [moment]
    out = []
    for candidate in candidates:
        try:
            utc = candidate.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:
            raise LineError(f"{field_name}: time {text_[:40]!r} is out of range") from None
        if not FIRST_YEAR <= utc.year <= LAST_YEAR:
            raise LineError(f"{field_name}: time {text_[:40]!r} is out of range")
        if utc not in out:
            out.append(utc)
    return out


def start_and_end(
    starts: list[datetime], ends: list[datetime], elapsed: int | None, record: dict
) -> tuple[datetime | None, datetime | None]:
    """Start and End, with each time of the repeated DST hour read so that End is not
    before Start and, when sacct gives the elapsed time, so that they agree with it."""
    if not starts or not ends:
        return (starts[0] if starts else None), (ends[0] if ends else None)
    pairs = [(s, e) for s in starts for e in ends if e >= s]
    if not pairs:
        raise LineError(
            f"End {record.get('end', '').strip()} is before Start {record.get('start', '').strip()}"
        )
    if elapsed is not None:
        return min(pairs, key=lambda p: abs((p[1] - p[0]).total_seconds() - elapsed))
    return pairs[0]


def whole_number(text_: str, field_name: str, maximum: int = INT32_MAX) -> int:
    text_ = text_.strip()
    match = _WHOLE.match(text_)
    if not match:
        if text_.startswith("-") and _WHOLE.match(text_[1:]):
            raise LineError(f"{field_name}: expected a non-negative number, got {text_[:40]!r}")
        raise LineError(f"{field_name}: expected a whole number, got {text_[:40]!r}")
    value = int(match.group(1))
    if value > maximum:
        raise LineError(f"{field_name}: {text_[:40]} is out of range (at most {maximum:,})")
    return value
