"""What a GPU-hour costs, by card model: one price for every figure the tool shows.

A card is named differently by every source: nvidia-smi and DCGM say ``NVIDIA H100 80GB
HBM3`` or ``NVIDIA A800-SXM4-40GB``, W&B copies that, Slurm GRES says ``a100_80gb`` or
``rtx_3090``. A name is read as its tokens (lower case, split at anything not a letter or
digit, memory sizes as ``80gb``) and matched to the catalogue entry whose tokens it holds,
the most specific first (``A100 80GB`` before ``A100``; ``L4`` is a token, so it never
matches an ``L40S``).

Prices, most specific first: ``[prices] by_cluster`` for the job's cluster, then
``[prices] gpu_hour_usd`` (keys read like card names: ``H100``, ``A100 80GB``), then the
catalogue below, then ``[prices] gpu_hour_usd.default``. The fallback is said in every
formula that uses it, with the card name nothing matched.

Catalogue prices: rounded on-demand list prices of GPU clouds and the large clouds'
GPU instances per GPU-hour, as published in 2025-2026 (Lambda, RunPod, CoreWeave, AWS,
Google Cloud, Azure; Chinese clouds for H800/H20/A800). Providers differ by ±30 % and
committed-use prices are far lower: set your own in ``[prices]``. Memory and dense
FP16/BF16 tensor throughput are NVIDIA's datasheet figures; the throughput is used only to
tell whether a smaller card would have kept up with a job (OVP002/OVP003).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from audit.config import Config

PRICE_AS_OF = "2025-2026"
DEFAULT_PRICE = 2.00


@dataclass(frozen=True)
class Card:
    key: str  # the catalogue's name of the card
    tokens: tuple[frozenset[str], ...]  # any of these token sets names it
    memory_gb: float
    tflops: float  # dense FP16/BF16 tensor throughput
    mig: bool  # can be split into MIG instances (a share of the card)
    price: float  # USD per GPU-hour, on demand


def _t(*names: str) -> tuple[frozenset[str], ...]:
    return tuple(frozenset(n.split()) for n in names)


# Most specific first within a model; the matcher prefers more tokens anyway.
CATALOGUE: tuple[Card, ...] = (
    Card("B200", _t("b200"), 180, 2250, True, 5.50),
    Card("H200", _t("h200"), 141, 989, True, 3.80),
    Card("H100 NVL", _t("h100 nvl"), 94, 835, True, 3.00),
    Card("H100 PCIe", _t("h100 pcie"), 80, 756, True, 2.40),
    Card("H100 SXM", _t("h100 sxm", "h100 sxm5", "h100 hbm3", "h100"), 80, 989, True, 3.00),
    Card("H800", _t("h800"), 80, 989, True, 2.80),
    Card("H20", _t("h20"), 96, 148, True, 1.20),
    Card("A100 40GB", _t("a100 40gb"), 40, 312, True, 1.20),
    Card("A100 80GB", _t("a100 80gb", "a100"), 80, 312, True, 1.60),
    Card("A800 40GB", _t("a800 40gb"), 40, 312, True, 1.10),
    Card("A800 80GB", _t("a800 80gb", "a800"), 80, 312, True, 1.50),
    Card("L40S", _t("l40s"), 48, 362, False, 1.00),
    Card("L40", _t("l40"), 48, 181, False, 0.85),
    Card("L4", _t("l4"), 24, 121, False, 0.70),
    Card("A10G", _t("a10g"), 24, 70, False, 0.75),
    Card("A10", _t("a10"), 24, 125, False, 0.70),
    Card("V100 16GB", _t("v100 16gb"), 16, 125, False, 0.50),
    Card("V100", _t("v100 32gb", "v100"), 32, 125, False, 0.55),
    Card("T4", _t("t4"), 16, 65, False, 0.35),
    Card("RTX 4090", _t("rtx 4090", "rtx4090", "4090"), 24, 165, False, 0.45),
    Card("RTX 3090", _t("rtx 3090", "rtx3090", "3090"), 24, 71, False, 0.25),
    Card("RTX 3060", _t("rtx 3060", "rtx3060", "3060"), 12, 25, False, 0.12),
)

_TOKEN = re.compile(r"[a-z0-9]+")
_MEMORY = re.compile(r"^(\d{1,4})g(?:b|ib)?$")


def tokens(name: str) -> frozenset[str]:
    """A card name's tokens: ``NVIDIA A800-SXM4-40GB`` → {nvidia, a800, sxm4, 40gb}."""
    out = set()
    for token in _TOKEN.findall(name.lower()):
        memory = _MEMORY.match(token)
        out.add(f"{memory.group(1)}gb" if memory else token)
    return frozenset(out)


def card_of(name: str | None) -> Card | None:
    """The catalogue card a source's name for it names, or None."""
    if not name:
        return None
    have = tokens(name)
    best: tuple[int, int] | None = None
    found = None
    for order, card in enumerate(CATALOGUE):
        for wanted in card.tokens:
            if wanted <= have and (best is None or (len(wanted), -order) > best):
                best, found = (len(wanted), -order), card
    return found


@dataclass(frozen=True)
class Price:
    usd: float
    key: str  # what matched, for formulas: a config key, a catalogue card, or the fallback
    fallback: bool = False


class Prices:
    """The price of a GPU-hour of a card, from the configuration and the catalogue."""

    def __init__(self, config: Config):
        settings = config.prices
        given = dict(settings.gpu_hour_usd)
        self.default = float(given.pop("default", DEFAULT_PRICE))
        self.overrides = [(tokens(k), k, float(v)) for k, v in given.items()]
        self.by_cluster = {
            cluster: [(tokens(k), k, float(v)) for k, v in table.items()]
            for cluster, table in settings.by_cluster.items()
        }
        self._known: dict[tuple, Price] = {}

    def __call__(self, gpu_type: str | None, cluster: str | None = None) -> Price:
        key = (gpu_type, cluster)
        if key not in self._known:
            self._known[key] = self._price(gpu_type, cluster)
        return self._known[key]

    def _price(self, gpu_type: str | None, cluster: str | None) -> Price:
        have = tokens(gpu_type or "")
        for table, where in (
            (self.by_cluster.get(cluster or "", []), f"[prices] by_cluster.{cluster}"),
            (self.overrides, "[prices] gpu_hour_usd"),
        ):
            matches = [(len(t), k, usd) for t, k, usd in table if t and t <= have]
            if matches:
                _n, name, usd = max(matches, key=lambda m: (m[0], len(m[1])))
                return Price(usd, f"{name}, {where}")
        card = card_of(gpu_type)
        if card is not None:
            return Price(card.price, card.key)
        what = f"no price for {gpu_type!r}" if gpu_type else "card model unknown"
        return Price(self.default, f"default ({what})", fallback=True)


def gpu_price(
    config: Config, gpu_type: str | None, cluster: str | None = None
) -> tuple[float, str]:
    """USD per GPU-hour of a card, and what the price stands on (for formulas)."""
    price = Prices(config)(gpu_type, cluster)
    return price.usd, price.key


# A card is enough for a job when the job's memory peak fits with this headroom and its
# utilisation, scaled to the card's throughput, stays at or under the ceiling.
MEMORY_HEADROOM = 1.2
UTIL_CEILING_PCT = 80.0
MAX_SHARE = 7  # a card split more ways than MIG's seven slices is not a realistic offer


@dataclass(frozen=True)
class Fit:
    """The cheapest card, or share of the job's own card, that would have served a job."""

    label: str  # "a T4", "a 1/6 share of the V100 (MIG, MPS or time-slicing)"
    usd: float  # per GPU-hour of the job
    why: str  # the arithmetic that says it fits


def article(name: str) -> str:
    """ "a" or "an" before a card name, as it is read aloud (an H100, an L4, a T4)."""
    return "an" if name[:1].upper() in "AEFHILMNORSX8" else "a"


def cheapest_fit(
    prices: Prices,
    current: Card | None,
    price: float,
    peak_mib: float,
    util_pct: float,
    capacity_mib: float | None = None,
    available: frozenset[str] | None = None,
) -> Fit | None:
    """The cheapest way to serve one GPU of a job that peaked at ``peak_mib`` of memory at
    ``util_pct`` utilisation on ``current`` (priced ``price``): another card of
    ``available`` (catalogue keys: the cards the warehouse has seen; None: any) whose memory
    holds the peak with headroom and whose throughput keeps the scaled utilisation under
    the ceiling, or a 1/k share of the same card. None when nothing is cheaper."""
    need_gb = peak_mib * 2**20 / 1e9 * MEMORY_HEADROOM
    util = max(util_pct, 0.1)  # a busy-at-0 % job is IDL002's; 0 would mean any share fits
    options: list[Fit] = []
    if current is not None:
        for card in CATALOGUE:
            if card.key == current.key or card.memory_gb < need_gb:
                continue
            if available is not None and card.key not in available:
                continue
            scaled = util * current.tflops / card.tflops
            if scaled > UTIL_CEILING_PCT:
                continue
            usd = prices(card.key).usd
            options.append(
                Fit(
                    f"{article(card.key)} {card.key}",
                    usd,
                    f"{card.key}: {card.memory_gb:g} GB ≥ {need_gb:.1f} GB (peak × "
                    f"{MEMORY_HEADROOM:g}) and {util:.0f} % × {current.tflops:g}/{card.tflops:g} "
                    f"TFLOPS = {scaled:.0f} % ≤ {UTIL_CEILING_PCT:g} %",
                )
            )
    capacity_gb = (
        capacity_mib * 2**20 / 1e9 if capacity_mib else (current.memory_gb if current else None)
    )
    if capacity_gb:
        ways = int(min(UTIL_CEILING_PCT / util, capacity_gb / max(need_gb, 1e-9), MAX_SHARE))
        if ways >= 2:
            name = current.key if current else "card"
            how = "MIG, MPS or time-slicing" if current and current.mig else "MPS or time-slicing"
            options.append(
                Fit(
                    f"a 1/{ways} share of the {name} ({how})",
                    price / ways,
                    f"{ways} = min({UTIL_CEILING_PCT:g} % / {util:.0f} %, {capacity_gb:.0f} GB / "
                    f"{need_gb:.1f} GB, {MAX_SHARE}) jobs of this size fit on one card",
                )
            )
    cheaper = [o for o in options if o.usd < price]
    return min(cheaper, key=lambda o: (o.usd, o.label)) if cheaper else None
