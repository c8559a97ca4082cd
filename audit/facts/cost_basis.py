"""The value types of cost and attribution that run and job facts share: a ``Cost`` (GPUs
× hours × price, with the evidence it stands on), the team a run or job is charged to, and
the card name it is priced by. ``audit.costs`` explains the ladder that picks a run's GPU
count; ``audit.facts.jobs`` holds the jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from audit.facts.prices import card_of
from audit.text import counted

HOUR = 3600.0


RUNG_LABELS = {
    "slurm": "Slurm allocation",
    "devices": "GPU list the run recorded",
    "world_size": "world size the framework reported",
    "params": "parallelism from params",
    "activity": "estimated from GPU activity",
    "default": "assumed [cost] default",
    "unknown": "GPU count unknown",
}
# rungs whose GPU count is the run's allocation (idle GPUs among them are its waste)
ALLOCATION_RUNGS = frozenset({"slurm", "devices", "world_size", "params", "default"})


def money(gpu_hours: float, price: float, price_key: str) -> str:
    return f"{gpu_hours:.2f} GPU-h × ${price:.2f}/GPU-h ({price_key}) = ${gpu_hours * price:,.2f}"


def hours_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max((end - start).total_seconds(), 0.0) / HOUR


@dataclass(frozen=True, slots=True)
class Cost:
    """GPUs × hours × price of one run or job, with the evidence it stands on."""

    rung: str  # slurm | devices | world_size | params | activity | default | unknown
    gpus: float | None
    gpu_type: str | None
    hours: float | None  # how long the GPUs were held (job elapsed, else run wall clock)
    price: float
    price_key: str
    source: str  # the evidence for the GPU count, e.g. "Slurm job 123", "param num_gpus"
    # the GPU ids the run recorded (rung devices), to pick its GPUs among a machine's
    devices: tuple[str, ...] | None = None

    @property
    def fallback_price(self) -> bool:
        """Priced at ``[prices] default``: no price for the card (or the card unknown)."""
        return self.price_key.startswith("default")

    @property
    def is_allocation(self) -> bool:
        """The count is what the run held (Slurm, its device list, its parallelism, the
        configured default), not only what was seen busy."""
        return self.rung in ALLOCATION_RUNGS

    @property
    def known(self) -> bool:
        return self.gpus is not None and self.hours is not None

    @property
    def gpu_hours(self) -> float | None:
        return self.gpus * self.hours if self.known else None

    @property
    def usd(self) -> float | None:
        gpu_hours = self.gpu_hours
        return None if gpu_hours is None else gpu_hours * self.price

    @property
    def rung_label(self) -> str:
        return RUNG_LABELS[self.rung]

    @property
    def basis(self) -> str:
        duration = f"{self.hours:.2f} h" if self.hours is not None else "an unknown duration"
        if self.rung == "slurm":
            return f"{self.source}: {_gpus(self.gpus)} × {duration} elapsed"
        if self.rung == "unknown":
            if self.hours is None:
                return "GPU count and duration unknown"
            return f"GPU count unknown: {self.hours:.2f} run-hours"
        verb = "assumed" if self.rung == "default" else "estimated"
        return f"{verb}: {_gpus(self.gpus)} from {self.source} × {duration} wall clock"

    def part(self, hours: float) -> tuple[float | None, float | None]:
        """GPU-hours and dollars of ``hours`` of this allocation (None when GPUs unknown)."""
        if self.gpus is None:
            return None, None
        gpu_hours = self.gpus * hours
        return gpu_hours, gpu_hours * self.price

    def formula(self, gpu_hours: float | None = None) -> str:
        gpu_hours = self.gpu_hours if gpu_hours is None else gpu_hours
        if gpu_hours is None:
            return f"{self.basis}: no dollar figure"
        return money(gpu_hours, self.price, self.price_key)


def _gpus(value: float | None) -> str:
    return "? GPUs" if value is None else counted(value, "GPU")


TEAM_SOURCES = ("tag", "account", "user")


def team_of(order: list[str], tag: str | None, account: str | None, user: str | None):
    """The team and where it came from: the first known of ``order`` (tag, account, user)."""
    for source in order:  # called per job and run: no dict of the three (1 s a million)
        value = tag if source == "tag" else account if source == "account" else user
        if value and source in TEAM_SOURCES:
            return value, source
    return None, None


def named_card(allocated: str | None, host_model: str | None) -> str | None:
    """The name a job's card is priced by: its hosts' model name when it is the allocation's
    card, said more precisely (GRES ``a100`` on a host reporting ``NVIDIA A100-SXM4-40GB``
    is a 40 GB card), else the allocation's type, else the hosts' model."""
    if allocated is None or host_model is None:
        return allocated or host_model
    given, seen = card_of(allocated), card_of(host_model)
    if given is not None and seen is not None and given.key.split()[0] == seen.key.split()[0]:
        return host_model
    return allocated
