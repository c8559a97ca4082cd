"""Charts as inline SVG, drawn server-side with matplotlib: no JavaScript, no network.

Every chart carries a title and an alt text; the SVG gets a <title> and role="img" so
screen readers and e-mail clients without SVG support still say what it shows.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import matplotlib

from audit.text import terminal_safe as safe

matplotlib.use("Agg")
import matplotlib.pyplot as plt

plt.rcParams.update(
    {
        "svg.hashsalt": "audit",  # stable ids: the same data gives the same SVG
        "svg.fonttype": "none",  # text stays text (searchable, small)
        # names are data: "$...$" in a run or dataset name must not be parsed as TeX
        "text.parse_math": False,
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)
PALETTE = ["#3b6ea8", "#d08c2b", "#5a9e6f", "#b5475b", "#7d63a8", "#6b6b6b", "#2a9d9d", "#a06a3b"]
METHOD_MARKERS = {"sft": "o", "rl": "s", "opd": "^"}


@dataclass
class Chart:
    title: str
    alt: str
    svg: str


def _svg(fig, title: str, alt: str) -> Chart:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF boilerplate
    # replacement functions: names in titles are data, never regex templates ("\x" in a name)
    label = '<svg role="img" aria-label="' + _attr(alt) + '" '
    text = re.sub(r"<svg ", lambda _: label, text, count=1)
    text = re.sub(
        r"(<svg[^>]*>)", lambda m: m[1] + "<title>" + _text(title) + "</title>", text, count=1
    )
    return Chart(title=title, alt=alt, svg=text)


LABEL_CHARS = 60  # a team, method or run name of a megabyte would take minutes to lay out


def _visible(labels: list[str]) -> list[str]:
    # control characters have no glyph: show them as escapes, as the terminal output does
    return [_label(label) for label in labels]


def _label(text: str) -> str:
    shown = safe(text)
    return shown if len(shown) <= LABEL_CHARS else shown[: LABEL_CHARS - 1] + "…"


def _attr(text: str) -> str:
    return _text(text).replace('"', "&quot;")


def _text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def bar(title: str, labels: list[str], values: list[float], unit: str, alt: str) -> Chart:
    fig, ax = plt.subplots(figsize=(6.0, 0.35 * max(len(labels), 3) + 0.8))
    positions = range(len(labels))
    ax.barh(list(positions), values, color=PALETTE[0])
    ax.set_yticks(list(positions), labels=_visible(labels))
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    for y, value in zip(positions, values, strict=True):
        ax.text(value, y, f" {value:,.0f}", va="center", fontsize=8)
    ax.set_title(safe(title), loc="left")
    return _svg(fig, title, alt)


def grouped(
    title: str, labels: list[str], series: dict[str, list[float]], unit: str, alt: str
) -> Chart:
    fig, ax = plt.subplots(figsize=(6.0, 2.8))
    width = 0.8 / max(len(series), 1)
    for index, (name, values) in enumerate(series.items()):
        ax.bar(
            [i + index * width for i in range(len(labels))],
            values,
            width,
            label=_label(name),
            color=PALETTE[index],
        )
    ax.set_xticks(
        [i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels=_visible(labels)
    )
    ax.set_ylabel(unit)
    ax.legend(frameon=False)
    ax.set_title(safe(title), loc="left")
    return _svg(fig, title, alt)


def trend(title: str, weeks: list[str], values: list[float | None], unit: str, alt: str) -> Chart:
    fig, ax = plt.subplots(figsize=(6.0, 2.4))
    xs = [i for i, v in enumerate(values) if v is not None]
    ax.plot(xs, [values[i] for i in xs], marker="o", color=PALETTE[3])
    ax.set_xticks(range(len(weeks)), labels=weeks, rotation=0)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_title(safe(title), loc="left")
    return _svg(fig, title, alt)


def forgetting(title: str, points: list[dict], alt: str) -> Chart:
    """Change in general ability (y) against the gain on the target task (x), per run."""
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    methods = sorted({p["method"] for p in points})
    for index, method in enumerate(methods):
        mine = [p for p in points if p["method"] == method]
        ax.scatter(
            [p["target_gain"] for p in mine],
            [p["general_change"] for p in mine],
            label=_label(method),
            marker=METHOD_MARKERS.get(method, "D"),
            color=PALETTE[index],
            s=36,
        )
    ax.axhline(0, color="#999999", linewidth=0.8)
    ax.set_xlabel("gain on the target task (vs base model)")
    ax.set_ylabel("change in general ability")
    ax.legend(frameon=False, title="method")
    ax.set_title(safe(title), loc="left")
    return _svg(fig, title, alt)


def matrix(title: str, runs: list[dict], alt: str) -> Chart:
    """One (base model, task): GPU-hours (x) against target gain (y), a marker per method
    and the change in general ability as colour (red lost, blue gained, centred on 0)."""
    from matplotlib.colors import TwoSlopeNorm

    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    changes = [r["general_change"] for r in runs]
    spread = max(max(abs(c) for c in changes), 1e-3)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-spread, vmax=spread)
    drawn = None
    for method in sorted({r["method"] for r in runs}):
        mine = [r for r in runs if r["method"] == method]
        drawn = ax.scatter(
            [r["gpu_hours"] for r in mine],
            [r["target_gain"] for r in mine],
            c=[r["general_change"] for r in mine],
            cmap="RdBu",
            norm=norm,
            marker=METHOD_MARKERS.get(method, "D"),
            edgecolors="#333333",
            linewidths=0.6,
            s=48,
            label=safe(method),
        )
    if len(runs) <= 12:
        for r in runs:
            ax.annotate(
                safe(r["run_name"]),
                (r["gpu_hours"], r["target_gain"]),
                fontsize=7,
                xytext=(4, 3),
                textcoords="offset points",
            )
    if drawn is not None:
        fig.colorbar(drawn, ax=ax, label="change in general ability")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("gain on the target task")
    ax.set_xlim(left=0)
    ax.legend(frameon=False, title="method", fontsize=8)
    ax.set_title(safe(title), loc="left")
    return _svg(fig, title, alt)


def series(title: str, points: list[list], onset_step, alt: str) -> Chart:
    """A small line of one metric over the steps, the onset marked; non-finite values
    (stored as text) drawn as red crosses on the top edge."""
    fig, ax = plt.subplots(figsize=(3.2, 1.2))
    finite = [(s, v) for s, v in points if isinstance(v, int | float)]
    broken = [s for s, v in points if not isinstance(v, int | float)]
    if finite:
        ax.plot([s for s, _ in finite], [v for _, v in finite], color=PALETTE[0], linewidth=1.2)
    if broken:
        top = max((v for _, v in finite), default=1.0)
        ax.scatter(broken, [top] * len(broken), marker="x", color=PALETTE[3], s=14)
    if onset_step is not None:
        ax.axvline(onset_step, color=PALETTE[3], linewidth=1.0, linestyle="--")
    ax.tick_params(labelsize=7)
    ax.set_title(safe(title), loc="left", fontsize=8)
    return _svg(fig, title, alt)
