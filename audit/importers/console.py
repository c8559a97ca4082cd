"""Facts a run's console output states about how it ran, read from its captured log.

Only what a training framework prints about itself: the world size (how many processes,
one GPU each, the job ran with). It is a better account of a run's GPUs than its config,
whose ``n_gpus_per_node`` may be a default the launcher overrode (verl's SFT trainer runs
with torchrun's world size and still logs ``trainer.n_gpus_per_node: 8``), and far better
than the machine's GPU list a tracker records.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from audit.importers.store_files import read_found_file

# Console logs grow to gigabytes on long runs; frameworks print their world size at the
# start (and in checkpoint file names all along): the first and last few MB are read.
HEAD_BYTES = 8 << 20
TAIL_BYTES = 8 << 20

# Each pattern is linear (no nested quantifiers) and anchored on a fixed word.
_WORLD_SIZE = (
    # verl / FSDP checkpoint files: model_world_size_4_rank_0.pt
    re.compile(rb"world_size_(\d{1,6})_rank_\d"),
    # torch.distributed, DeepSpeed, accelerate, Megatron: "world_size=4", "World size: 4",
    # "'world_size': 4", "WORLD_SIZE=4"
    re.compile(rb"(?i)\bworld[ _-]?size['\"]?\s{0,3}[:=]\s{0,3}(\d{1,6})\b"),
    # accelerate's environment summary: "Num processes: 4"
    re.compile(rb"\bNum processes: (\d{1,6})\b"),
)


def world_size(path: Path) -> tuple[int, str] | None:
    """The world size a console log states, with the line that says it; None when it
    states none, or several different ones (no guess between them)."""
    try:
        size = os.lstat(path).st_size
    except OSError:
        return None
    if size <= HEAD_BYTES + TAIL_BYTES:
        chunks = [read_found_file(path, HEAD_BYTES + TAIL_BYTES, "a console log")]
    else:
        chunks = [_read_part(path, 0, HEAD_BYTES), _read_part(path, size - TAIL_BYTES, TAIL_BYTES)]
    found: dict[int, str] = {}
    for chunk in chunks:
        for pattern in _WORLD_SIZE:
            for match in pattern.finditer(chunk):
                value = int(match.group(1))
                if value > 0:
                    found.setdefault(value, match.group(0).decode("utf-8", "replace"))
    if len(found) != 1:
        return None
    value, said = next(iter(found.items()))
    return value, said


def _read_part(path: Path, offset: int, length: int) -> bytes:
    # the file was checked by read_found_file's rules in world_size's caller path: a
    # regular file inside the run folder, opened without following a link
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)
