"""Cutting a table's partitions into groups of bounded size, to read or write one group a
query: the Parquet export's COPYs and IDL003's host groups."""

from __future__ import annotations


def partition_slices(sizes: list[tuple[object, int]], limit: int) -> list[list[object]]:
    """Partition values (with their row counts, in order) cut into consecutive slices of
    at most ``limit`` rows, a partition larger than that alone in its slice. Each value is in
    exactly one slice, so the COPYs of a table write disjoint partition folders (and
    IDL003's queries read disjoint groups of hosts)."""
    slices: list[list[object]] = []
    rows = 0
    for value, count in sizes:
        if not slices or rows + count > limit:
            slices.append([])
            rows = 0
        slices[-1].append(value)
        rows += count
    return slices
