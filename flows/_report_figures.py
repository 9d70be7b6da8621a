"""Draw the report's figures and describe each one from the Axes it was drawn on.

Every figure is drawn with constrained layout and its legend placed outside the
axes (``fig.legend(loc="outside right upper")``), so no legend covers data.
Counts get integer ticks. The best-result figure shows the raw objective, on a
log axis when every plotted value is positive and on a linear one otherwise;
the axis label says which.

:func:`describe` reads back what a reader of the figure sees (titles, axis
labels and scales, the labelled ticks, the legend's entries and where the legend
and each Axes sit in the figure) from the same matplotlib objects that were
drawn. The report embeds it next to the PNG, so a test or a script can check a
figure without looking at pixels.

matplotlib is imported inside the functions (Agg, no pyplot), so importing this
module stays cheap.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_LEGEND = {"loc": "outside right upper", "fontsize": "small"}
#: Past this many rounds (or batches) a figure stops drawing one bar or box each.
MANY = 60


@dataclass(frozen=True)
class DrawnFigure:
    """One drawn figure: its PNG bytes and what it shows (see :func:`describe`)."""

    png: bytes
    description: dict[str, Any]


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global figure registry to leak

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)  # its renderer measures the legends for describe()
    return figure


def _integer_ticks(axis: Any) -> None:
    """Tick a count axis at whole numbers only."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _log_labels(axis: Any) -> None:
    """Label a log axis with plain numbers (0.001, not 10^-3).

    Decades are labelled; when the axis spans under two decades the 2 and 5
    multiples are too, and under half a decade every minor tick, so a narrow
    range still shows at least two values.
    """
    from matplotlib.ticker import Formatter

    class PlainLog(Formatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            if self.axis is None or x <= 0:
                return ""
            low, high = sorted(self.axis.get_view_interval())
            if low <= 0:
                return ""
            decades = math.log10(high / low)
            mantissa = round(x / 10 ** math.floor(math.log10(x) + 1e-9), 6)
            if decades < 0.5 or mantissa == 1.0 or (decades < 2 and mantissa in (2.0, 5.0)):
                return f"{x:g}"
            return ""

    axis.set_major_formatter(PlainLog())
    axis.set_minor_formatter(PlainLog())


def best_figure(rounds: Sequence[dict[str, Any]]) -> Any:
    """Draw each round's best objective (points) and the best so far (a step line).

    The values are the raw objective (lower is better). They are drawn on a log
    axis when all are positive, since after the first rounds they shrink by
    orders of magnitude, and on a linear axis otherwise.
    """
    from matplotlib.ticker import ScalarFormatter

    scored = [r for r in rounds if r["best"] is not None]
    xs = [r["index"] for r in scored]
    per_round = [float(r["best"]) for r in scored]
    so_far = [float(r["best_so_far"]) for r in scored]
    fig = _new_figure(7.5, 3.5)
    ax = fig.subplots()
    ax.plot(xs, per_round, "o", label="round best")
    ax.step(xs, so_far, where="post", label="best so far")
    if all(v > 0 for v in per_round + so_far):
        ax.set_yscale("log")
        _log_labels(ax.yaxis)
        scale = "log scale"
    else:
        # Raw values on the ticks: no offset ("+1.5e2") or multiplier ("1e-6") above them.
        plain = ScalarFormatter(useOffset=False)
        plain.set_scientific(False)
        ax.yaxis.set_major_formatter(plain)
        scale = "linear scale, values ≤ 0"
    ax.set(
        xlabel="round",
        ylabel=f"objective ({scale})",
        title="Best result per round (lower is better)",
    )
    _integer_ticks(ax.xaxis)
    fig.legend(**_LEGEND)
    return fig


_DISPOSITIONS = ("accepted", "fallback", "not_accepted", "failed", "pending")


def dispositions_figure(rounds: Sequence[dict[str, Any]]) -> Any:
    """Draw gate calls per round stacked by disposition, and the acceptance rate."""
    from matplotlib.ticker import PercentFormatter

    fig = _new_figure(7.5, 3.5)
    ax = fig.subplots()
    xs = [r["index"] for r in rounds]
    bottom = [0] * len(rounds)
    recorded = {d for r in rounds for d in r["dispositions"]}
    # The known ones in their usual order, then any other the store holds (e.g. "failed").
    layers: list[tuple[str, list[int]]] = []
    for disposition in (*_DISPOSITIONS, *sorted(recorded - set(_DISPOSITIONS))):
        heights = [r["dispositions"].get(disposition, 0) for r in rounds]
        if any(heights):
            layers.append((disposition, heights))
    if len(rounds) > MANY:  # one bar per round would be under 10 px: stacked areas instead
        labels, stacks = zip(*layers, strict=True) if layers else ((), ())
        ax.stackplot(xs, *stacks, labels=labels)
    for disposition, heights in layers if len(rounds) <= MANY else ():
        ax.bar(xs, heights, bottom=bottom, label=disposition)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(xlabel="round", ylabel="gate calls", title="Dispositions and acceptance rate")
    _integer_ticks(ax.xaxis)
    _integer_ticks(ax.yaxis)
    ax.margins(y=0.08)  # the tallest bar stops short of the frame
    rate = ax.twinx()
    rates = [math.nan if r["acceptance_rate"] is None else r["acceptance_rate"] for r in rounds]
    rate.plot(xs, rates, "k.-" if len(rounds) <= MANY else "k-", label="acceptance rate")
    rate.set(ylim=(-0.05, 1.05), ylabel="acceptance rate")
    rate.yaxis.set_major_formatter(PercentFormatter(1.0))
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = rate.get_legend_handles_labels()
    fig.legend(handles + more_handles, labels + more_labels, **_LEGEND)
    return fig


def rejections_figure(rejections: Sequence[dict[str, Any]]) -> Any:
    """Draw rejected attempts per check, the 15 most frequent."""
    by_check: dict[str, int] = {}
    for entry in rejections:
        by_check[entry["rejected_by"]] = by_check.get(entry["rejected_by"], 0) + entry["count"]
    ranked = sorted(by_check.items(), key=lambda kv: (-kv[1], kv[0]))[:15][::-1]
    fig = _new_figure(7.5, 1.2 + 0.35 * len(ranked))
    ax = fig.subplots()
    ax.barh([k for k, _ in ranked], [v for _, v in ranked])
    ax.set(xlabel="rejected attempts", title="Rejections by check")
    _integer_ticks(ax.xaxis)
    return fig


def simulation_figure(batches: Sequence[dict[str, Any]]) -> Any:
    """Draw each batch's wall time and its task runtimes.

    Up to :data:`MANY` batches, a bar and a box plot per batch, each labelled with
    its round. Past that, a box or a label per batch is narrower than the text it
    needs (and a thousand of them take a minute to lay out): the wall times are a
    line, the runtimes their median line in the band from the fastest to the
    slowest task, and the x axis is labelled at a few batches.
    """
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig = _new_figure(7.5, 5)
    wall, runtime = fig.subplots(2, 1, sharex=True)
    xs = list(range(len(batches)))
    walls = [b["wall_seconds"] or 0.0 for b in batches]
    samples = [b["runtimes"] or [0.0] for b in batches]
    wall.set(ylabel="seconds", title="Batch wall time (launched to finished)")
    runtime.set(xlabel="batch (by round)", ylabel="seconds", title="Task runtimes per batch")
    if len(batches) <= MANY:
        wall.bar(xs, walls)
        runtime.boxplot(samples, positions=xs)
        runtime.set_xticks(xs, [f"r{b['round_index']}" for b in batches])
        return fig
    wall.plot(xs, walls, "-", linewidth=0.8, label="wall time")
    lowest, highest = [min(s) for s in samples], [max(s) for s in samples]
    runtime.fill_between(xs, lowest, highest, alpha=0.3, linewidth=0, label="fastest to slowest")
    medians = [statistics.median(s) for s in samples]
    runtime.plot(xs, medians, "-", color="C1", linewidth=0.8, label="median")
    fig.legend(**_LEGEND)

    def by_round(x: float, _pos: int | None = None) -> str:
        whole = round(x)
        inside = 0 <= whole < len(batches) and abs(x - whole) < 1e-9
        return f"r{batches[whole]['round_index']}" if inside else ""

    runtime.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
    runtime.xaxis.set_major_formatter(FuncFormatter(by_round))
    return fig


# -- reading a figure back -------------------------------------------------------------


def _box(extent: Any, figure: Any) -> list[float]:
    """Return a display-space extent in figure fractions: [x0, y0, x1, y1]."""
    box = extent.transformed(figure.transFigure.inverted())
    return [round(float(v), 4) for v in (box.x0, box.y0, box.x1, box.y1)]


def _ticks(axis: Any) -> list[dict[str, Any]]:
    """Return the axis's labelled ticks inside its view, by value: value and label."""
    low, high = sorted(axis.get_view_interval())
    found: dict[float, str] = {}
    for ticker in (axis.minor, axis.major):  # a major label wins over a minor one
        locations = [v for v in ticker.locator() if low <= v <= high]
        for value, label in zip(locations, ticker.formatter.format_ticks(locations), strict=True):
            if label:
                found[float(value)] = label
    return [{"value": v, "label": found[v]} for v in sorted(found)]


def _lines(ax: Any) -> list[dict[str, Any]]:
    return [
        {
            "label": line.get_label(),
            "x": [float(v) for v in line.get_xdata()],
            "y": [float(v) for v in line.get_ydata()],
        }
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    ]


def describe(figure: Any) -> dict[str, Any]:
    """Return what ``figure`` shows, read from its Axes and legends after layout.

    For each Axes: title, axis labels, scales, labelled ticks (value and text),
    labelled lines (their data) and its box in figure fractions; for each legend
    its entries and box. Call it after the figure was drawn (layout applied).
    """
    renderer = figure.canvas.get_renderer()
    axes = []
    for ax in figure.axes:
        entry: dict[str, Any] = {
            "title": ax.get_title(),
            "box": _box(ax.get_window_extent(renderer), figure),
        }
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            shown = axis.get_visible() and (
                axis.get_label_text() or any(t.get_visible() for t in axis.get_ticklabels())
            )
            if not shown:
                continue
            entry[f"{name}label"] = axis.get_label_text()
            entry[f"{name}scale"] = axis.get_scale()
            entry[f"{name}ticks"] = _ticks(axis)
        entry["lines"] = _lines(ax)
        axes.append(entry)
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend()]
    return {
        "axes": axes,
        "legends": [
            {
                "labels": [t.get_text() for t in legend.get_texts()],
                "box": _box(legend.get_window_extent(renderer), figure),
            }
            for legend in legends
        ],
    }


def _drawn(figure: Any) -> DrawnFigure:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return DrawnFigure(buffer.getvalue(), describe(figure))


def draw(data: dict[str, Any]) -> dict[str, DrawnFigure]:
    """Draw the report's figures by file name; figures without data are left out."""
    import matplotlib

    matplotlib.use("Agg")
    drawn: dict[str, DrawnFigure] = {}
    rounds = data["rounds"]
    if any(r["best"] is not None for r in rounds):
        drawn["best.png"] = _drawn(best_figure(rounds))
    if rounds:
        drawn["dispositions.png"] = _drawn(dispositions_figure(rounds))
    if data["rejections"]:
        drawn["rejections.png"] = _drawn(rejections_figure(data["rejections"]))
    batches = [b for b in data["batches"] if b["wall_seconds"] is not None or b["runtimes"]]
    if batches:
        drawn["simulation.png"] = _drawn(simulation_figure(batches))
    return drawn
