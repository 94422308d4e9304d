"""The HTML page's matplotlib plots (Agg canvas, no pyplot), as PNG bytes."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..report.model import Report
from ..scoring import metric_label
from .model import (
    _DPI,
    DASH,
    _aggregate,
    _confidence,
    _failure,
    _first_realizations,
    _has_gpu,
    _headline,
    _interval,
    _outcomes,
    _score,
    _sources,
    _unique,
    _usd_per_trajectory,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True, slots=True)
class _Plot:
    png: bytes
    alt: str
    caption: str


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    # No "Software" tEXt chunk: it would put matplotlib's URL into the page; fixed DPI for stable output.
    figure.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    return buffer.getvalue()


# A qualitative palette of 16 colours that stay apart on white (tab10, then black, navy, magenta, olive, pink
# and purple, each picked as the farthest in CIELAB from those before it; the closest pair is ΔE76 ≈ 28, as
# within tab10 itself). Past 16 methods the colours repeat with a hatch (bars) or another marker (points).
PALETTE = (
    *("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"),
    *("#17becf", "#000000", "#000075", "#f032e6", "#637939", "#fabed4", "#911eb4"),
)

_HATCHES = ("", "///", "...", "xxx", "\\\\\\", "ooo")
_MARKERS = "osD^v<>ph*X"


@dataclass(frozen=True, slots=True)
class _Style:
    """How one method looks in every plot: its colour, and a hatch and marker that tell repeats apart."""

    color: str
    hatch: str
    marker: str


def method_styles(n: int) -> list[_Style]:
    """Styles for ``n`` methods: distinct colours for up to 16, then the colours again with a hatch and a
    different marker per round, so that no two methods look alike."""
    styles = []
    for i in range(n):
        round_, index = divmod(i, len(PALETTE))
        styles.append(
            _Style(
                PALETTE[index], _HATCHES[round_ % len(_HATCHES)], _MARKERS[(index + round_) % len(_MARKERS)]
            )
        )
    return styles


def _short(label: str, limit: int = 28) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _wrap(label: str, width: int = 14) -> str:
    """A tick label on at most two lines, so that neighbouring labels do not run into each other."""
    lines = textwrap.wrap(label, width, break_on_hyphens=True) or [label]
    return "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")


def _percent_axis(ax: Axes, metric: str, report: Report) -> None:
    ax.set_ylabel(f"{metric_label(metric)} (%)")
    ax.set_ylim(0, 100)  # zero-based and the full scale: bar heights compare across backbones and pages
    ax.set_yticks(range(0, 101, 20))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(
        f"{metric_label(metric)} ({_aggregate(report)}), {_confidence(report):.0%} intervals",
        fontsize=10,
    )


def _accuracy_plot(report: Report) -> _Plot | str:
    first = _first_realizations(report)
    outcomes = _outcomes(report)
    failures = {key: _failure(report, row, outcomes) for key, row in first.items()}
    values = {key: None if failures[key] else _headline(report, row) for key, row in first.items()}
    if not any(_score(v, m) is not None for v in values.values() for m in ("agent_acc", "step_acc")):
        return "Accuracy plot omitted: no Agent or Step Acc in this report."
    backbones = _unique(b for b, _ in first)
    methods = _unique(m for _, m in first)
    styles = method_styles(len(methods))
    bars = len(backbones) * len(methods)
    # Width grows with the bars (about 0.13 in each) up to the page's width at 1:1 (1280 px at _DPI), so that
    # the labels keep their size; the two metrics are stacked, each over the full width.
    figure = _figure(min(11.6, max(7.0, 2.0 + 0.13 * bars + 0.3 * len(backbones))), 7.4)
    axes = figure.subplots(2, 1, sharex=True)
    width = 0.84 / len(methods)
    for ax, metric in zip(axes, ("agent_acc", "step_acc"), strict=True):
        for j, method in enumerate(methods):
            xs, heights, low, high = [], [], [], []
            for i, backbone in enumerate(backbones):
                key = (backbone, method)
                value = _score(values.get(key), metric)
                x = i - 0.42 + width * (j + 0.5)
                if value is not None:
                    bounds = _interval(report, first[key], metric) or (value, value)
                    xs.append(x)
                    heights.append(value * 100)
                    low.append((value - bounds[0]) * 100)
                    high.append((bounds[1] - value) * 100)
                elif key in first:  # a failed cell is marked as one, never drawn as a zero score
                    failure = failures[key]
                    word = failure.word if failure else "n/a"
                    ax.plot([x], [1.5], marker="x", color="#b00020", markersize=5, linestyle="")
                    ax.text(x, 4, word, ha="center", va="bottom", fontsize=6.5, color="#b00020", rotation=90)
            style = styles[j]
            drawn = ax.bar(
                xs,
                heights,
                width * 0.9,
                color=style.color,
                hatch=style.hatch,
                edgecolor="white" if not style.hatch else "0.2",
                linewidth=0.4,
                label=_short(method),
                yerr=[low, high],
                error_kw={"elinewidth": 0.8, "capsize": 1.5 if bars > 30 else 2.5, "ecolor": "0.25"},
            )
            if bars <= 16:
                ax.bar_label(drawn, fmt="%.1f", fontsize=7, padding=2)
        _percent_axis(ax, metric, report)
    labels = [_wrap(b) for b in backbones]
    rotate = len(backbones) > 6 or max(len(b) for b in backbones) * len(backbones) > 90
    axes[1].set_xticks(
        range(len(backbones)), labels, rotation=30 if rotate else 0, ha="right" if rotate else "center"
    )
    axes[1].set_xlim(-0.5, len(backbones) - 0.5)
    figure.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=min(len(methods), 7),
        fontsize=8,
        frameon=False,
    )
    caption = (
        f"Agent and Step Acc per backbone (groups) and method (bars), first realization, with "
        f"{_confidence(report):.0%} intervals (error bars, as in the table); the axis runs from 0 to 100%. A red "
        "× with a word (failed, skipped, unreadable, ...) marks a cell whose number rests on too few readable "
        "answers: not a zero score (see Outcomes)."
    )
    return _Plot(
        _png(figure), "Bar chart of Agent and Step Acc per backbone and method, with intervals", caption
    )


def _cost_plot(report: Report) -> _Plot | str:
    usd = _usd_per_trajectory(report, with_gpu=True)
    if not usd:
        return "Accuracy-versus-cost plot omitted: no USD per trajectory in this report."
    first = _first_realizations(report)
    outcomes = _outcomes(report)
    points = []
    for (backbone, method), row in first.items():
        step = _score(_headline(report, row), "step_acc")
        if (backbone, method) in usd and step is not None and _failure(report, row, outcomes) is None:
            bounds = _interval(report, row, "step_acc") or (step, step)
            points.append((backbone, method, usd[backbone, method], step * 100, bounds))
    if not points:
        return "Accuracy-versus-cost plot omitted: no backbone × method has both a cost and a Step Acc."
    backbones = _unique(p[0] for p in points)
    methods = _unique(p[1] for p in points)
    styles = method_styles(len(methods))
    figure = _figure(9.0, 4.2)
    ax = figure.subplots()
    annotate = _apart([(p[2], p[3]) for p in points])
    for backbone, method, x, y, (low, high) in points:
        style = styles[methods.index(method)]
        marker = _MARKERS[backbones.index(backbone) % len(_MARKERS)] if len(backbones) > 1 else style.marker
        ax.errorbar(
            [x],
            [y],
            yerr=[[y - low * 100], [high * 100 - y]],
            fmt=marker,
            color=style.color,
            markersize=6,
            elinewidth=0.7,
            capsize=2,
            zorder=3,
        )
        if annotate:
            label = (
                _short(method) if len(backbones) == 1 else f"{_short(backbone, 16)} · {_short(method, 16)}"
            )
            ax.annotate(label, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=7)
    scale = _cost_scale(ax, [p[2] for p in points])
    gpu = _has_gpu(report)
    money = "API + GPU USD" if gpu else "USD"
    ax.set_xlabel(f"{money} per trajectory, summed over stages ({scale})")
    ax.set_ylabel(f"Step Acc (%, {_aggregate(report)})")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    _cost_legend(ax, backbones, methods, styles)
    caption = (
        f"Step Acc (with its {_confidence(report):.0%} interval) against {money} per trajectory, one point per "
        "backbone × method (first realization); colour: method, marker: backbone. Cells whose number is not "
        "shown are left out."
    )
    return _Plot(_png(figure), "Scatter plot of Step Acc against USD per trajectory", caption)


def _cost_scale(ax: Axes, xs: Sequence[float]) -> str:
    """Log x when the positive costs span more than 100×; free (zero-cost) points stay visible via symlog."""
    positive = [x for x in xs if x > 0]
    if positive and max(positive) / min(positive) > 100:
        if len(positive) < len(xs):
            ax.set_xscale("symlog", linthresh=min(positive))
            ax.set_xlim(-0.3 * min(positive), max(positive) * 2)
            return "symlog scale, linear below the cheapest paid point"
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 2)
        return "log scale"
    top = max(xs)
    ax.set_xlim(-0.05 * top if top > 0 else -1, top * 1.3 if top > 0 else 1)
    return "linear scale"


def _apart(points: Sequence[tuple[float, float]], limit: int = 12) -> bool:
    """Whether names can stand beside the points without overprinting: few points, none close to another
    (within 8% of the x range and 5 points of accuracy). Otherwise the legend alone says which is which."""
    if len(points) > limit:
        return False
    xs = [x for x, _ in points]
    width = (max(xs) - min(xs)) or 1.0
    return all(
        abs(a[0] - b[0]) / width > 0.08 or abs(a[1] - b[1]) > 5
        for i, a in enumerate(points)
        for b in points[i + 1 :]
    )


def _cost_legend(
    ax: Axes, backbones: Sequence[str], methods: Sequence[str], styles: Sequence[_Style]
) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    single = len(backbones) == 1
    handles: list[Any] = [
        Line2D([], [], linestyle="", marker=s.marker, color=s.color, label=_short(m))
        if single
        else Patch(color=s.color, label=_short(m))  # colour alone: the markers name the backbones
        for m, s in zip(methods, styles, strict=True)
    ]
    if not single:
        handles += [
            Line2D([], [], linestyle="", marker=_MARKERS[i % len(_MARKERS)], color="0.3", label=_short(b))
            for i, b in enumerate(backbones)
        ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _source_plot(report: Report) -> _Plot | str:
    first = _first_realizations(report)
    sources = _sources(report)
    if not first or not sources:
        return "Per-source heat map omitted: no per-source metrics in this report."
    import numpy as np
    from matplotlib import colormaps

    single = len(_unique(b for b, _ in first)) == 1
    labels = [_short(m) if single else f"{_short(b, 18)} · {_short(m, 18)}" for b, m in first]
    grid = np.full((len(first), len(sources)), np.nan)
    outcomes = _outcomes(report)
    for i, row in enumerate(first.values()):
        failed = _failure(report, row, outcomes) is not None
        for j, source in enumerate(sources):
            value = None if failed else _score(row.per_source.get(source), "step_acc")
            if value is not None:
                grid[i, j] = value * 100
    if np.isnan(grid).all():
        return "Per-source heat map omitted: no per-source Step Acc in this report."
    figure = _figure(min(14.0, 3.2 + 1.15 * len(sources)), min(12.0, 1.3 + 0.42 * len(first)))
    ax = figure.subplots()
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        text = DASH if np.isnan(value) else f"{value:.1f}"
        color = "black" if np.isnan(value) or value >= 55 else "white"
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(
        range(len(sources)), [_short(s, 20) for s in sources], rotation=30 if len(sources) > 4 else 0
    )
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    figure.colorbar(image, ax=ax, label="Step Acc (%)", shrink=0.9)
    caption = (
        "Step Acc (%) per source; grey cells have no data, or a number the report does not show (see Outcomes). "
        "First realization."
    )
    return _Plot(_png(figure), "Heat map of Step Acc per source and method", caption)


# Where each plot goes: after the tables of its section.
_PLOTS: dict[str, Callable[[Report], _Plot | str]] = {
    "accuracy": _accuracy_plot,
    "per-source": _source_plot,
    "cost": _cost_plot,
}
