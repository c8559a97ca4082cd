"""The record framing W&B's ``.wandb`` and SwanLab's ``backup.swanlab`` logs share.

Both are LevelDB's log format (``doc/log_format.md`` of leveldb) behind a 7-byte header of
their own (4 identifying bytes, a 16-bit magic number, a version byte): 32 KiB blocks of
records, each with a CRC-32 of its type and data (zlib's CRC, seeded with the type byte),
its length and its type, a payload split into FULL or FIRST/MIDDLE/LAST fragments when it
does not fit the rest of a block, and zero filler where fewer than 7 bytes are left. W&B
puts protobuf messages in the payloads, SwanLab 0.6 and 0.7 JSON objects.

Damage: a file ending inside a record (a writer still running, or killed) ends the reading
with ``LogEnd.tail`` saying where; damage followed by more records is an ``InputError``
naming file and byte offset. Memory is bounded: one block is read at a time and a record is
at most ``max_record_bytes``.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from audit.errors import InputError
from audit.importers.store_files import require_found_file

HEADER_SIZE = 7
BLOCK = 32768
FRAGMENT_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_FRAGMENT = struct.Struct("<IHB")  # CRC-32 of type and data, data length, type
_TYPE_CRC = {kind: zlib.crc32(bytes([kind])) for kind in (FULL, FIRST, MIDDLE, LAST)}
MAX_RECORD_BYTES = 64 * 1024 * 1024  # larger than any record W&B (10 MB) or SwanLab writes


def log_header(ident: bytes, magic: int, version: int) -> bytes:
    return ident + struct.pack("<HB", magic, version)


@dataclass
class LogEnd:
    """How reading a log ended: where to go on from, and any damaged tail."""

    resume_offset: int = HEADER_SIZE
    record_at: int = HEADER_SIZE  # where the record last handed out began
    tail: str | None = None  # 'truncated at byte N …' when the log ends inside a record


def read_log(
    path: Path,
    header: bytes,
    what: str,
    start: int = HEADER_SIZE,
    end: LogEnd | None = None,
) -> Iterator[bytes]:
    """The payloads of the complete records of a log whose first bytes are ``header``
    (``what`` names such a log in messages: "a W&B transaction log"), from byte ``start``.

    ``end`` is filled in as reading goes: the offset after the last complete record, and
    what was wrong with the tail if the file ends inside a record.
    """
    end = end if end is not None else LogEnd()
    end.resume_offset = start
    require_found_file(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if start == HEADER_SIZE:
            head = f.read(HEADER_SIZE)
            if head != header:
                shown = head[:4].decode("latin-1").encode("unicode_escape").decode()
                raise InputError(
                    f"{path}: byte 0: not {what} (starts with {shown!r}, expected "
                    f"{header[:4].decode('latin-1')!r} and version {header[6]})"
                )
        f.seek(start)
        pos = start
        parts: list[bytes] = []
        record_start = pos
        record_bytes = 0
        stop = False
        while pos < size and not stop:
            # One read per 32 KiB block; its fragments are cut from memory.
            base = pos
            block = f.read(BLOCK - base % BLOCK)
            n = len(block)
            i = 0
            while i < n:
                at = base + i
                room = BLOCK - at % BLOCK
                if room < FRAGMENT_HEADER:  # block trailer: zero filler
                    break
                if i + FRAGMENT_HEADER > n:
                    if block[i:].strip(b"\0"):
                        end.tail = f"truncated at byte {at} (a record header cut short)"
                    stop = True
                    break
                crc, length, kind = _FRAGMENT.unpack_from(block, i)
                if kind == 0 and length == 0 and crc == 0:  # zero filler up to the next block
                    break
                problem = None
                if kind not in (FULL, FIRST, MIDDLE, LAST):
                    problem = f"unknown record type {kind}"
                elif length > room - FRAGMENT_HEADER:
                    problem = (
                        f"a record claims {length} bytes, more than the "
                        f"{room - FRAGMENT_HEADER} left in its 32 KiB block"
                    )
                elif i + FRAGMENT_HEADER + length > n:
                    end.tail = f"truncated at byte {at} (a record of {length} bytes cut short)"
                    stop = True
                    break
                else:
                    data = block[i + FRAGMENT_HEADER : i + FRAGMENT_HEADER + length]
                    if zlib.crc32(data, _TYPE_CRC[kind]) & 0xFFFFFFFF != crc:
                        problem = "CRC mismatch"
                if problem is not None:
                    after = at + FRAGMENT_HEADER + (length if problem == "CRC mismatch" else 0)
                    if _only_zeros_after(f, after, size):
                        end.tail = f"damaged last record at byte {at} ({problem})"
                        stop = True
                        break
                    raise InputError(
                        f"{path}: byte {at}: {problem}, followed by more records: the log is "
                        "damaged, not cut short"
                    )
                i += FRAGMENT_HEADER + length
                if kind in (FULL, FIRST):
                    if parts:
                        raise InputError(
                            f"{path}: byte {at}: a record starts inside the record "
                            f"begun at byte {record_start}"
                        )
                    record_start, record_bytes = at, 0
                elif not parts:
                    raise InputError(f"{path}: byte {at}: a record continues one that never began")
                record_bytes += length
                if record_bytes > MAX_RECORD_BYTES:
                    raise InputError(
                        f"{path}: byte {record_start}: a record longer than "
                        f"{MAX_RECORD_BYTES // 2**20} MiB; not {what} this tool can read"
                    )
                if kind == FULL:
                    end.resume_offset, end.record_at = base + i, record_start
                    yield data
                elif kind == LAST:
                    parts.append(data)
                    payload = b"".join(parts)
                    parts = []
                    end.resume_offset, end.record_at = base + i, record_start
                    yield payload
                else:
                    parts.append(data)
            pos = base + n
        if parts and end.tail is None:
            end.tail = f"truncated at byte {record_start} (a record split over blocks cut short)"


def _only_zeros_after(f, offset: int, size: int) -> bool:
    f.seek(offset)
    remaining = size - offset
    while remaining > 0:
        chunk = f.read(min(remaining, 1 << 20))
        if not chunk:
            break
        if chunk.strip(b"\0"):
            return False
        remaining -= len(chunk)
    return True
