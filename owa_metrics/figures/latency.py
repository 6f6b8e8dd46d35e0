"""The D2E latency curve: with ``bin_shifts``, the key accuracy, the button accuracy and the mean Pearson r of the
mouse moves against the shift k (true bin i against predicted bin i + k), in bins and ms, the best shift marked.
A model trained to act τ ahead peaks at τ; a clock bug shows as a peak away from 0."""

from __future__ import annotations

import re
from typing import Optional

# A shift key of `owa_metrics.functional.d2e.d2e_keys` -> (its key without the shift, k): the one place that reads
# the shift keys' spelling
SHIFT_KEY = re.compile(r"^(?P<name>.+)_shift_(?P<k>-?\d+)bins$")
CURVES = (("keyboard/key_accuracy", "key accuracy"), ("mouse_button/button_accuracy", "button accuracy"),
          ("mouse_move/pearson", "mean Pearson r (x, y)"))


def shift_of(key: str) -> Optional[tuple[str, int]]:
    """``(key without its shift, k)`` of a D2E shift key, None for another key."""
    found = SHIFT_KEY.match(key)
    return (found["name"], int(found["k"])) if found else None


def latency_curve(report: dict, prefix: str = "d2e") -> dict[str, dict[int, float]]:
    """The curves in a report with shifts: ``{curve: {k: value}}`` for the key accuracy, the button accuracy and the
    mean of ``pearson_x`` and ``pearson_y`` (each where defined; at a shift with one of them, that one), and
    ``best`` {k: value} the report's ``best_shift_bins`` (if any); empty without shift keys."""
    by_shift: dict[int, dict[str, float]] = {}
    for key, value in report.items():
        found = shift_of(key)
        if found and found[0].startswith(prefix + "/"):
            by_shift.setdefault(found[1], {})[found[0][len(prefix) + 1:]] = float(value)
    curves: dict[str, dict[int, float]] = {name: {} for name, _ in CURVES}
    for k in sorted(by_shift):
        keys = by_shift[k]
        for name, _ in CURVES[:2]:
            if name in keys:
                curves[name][k] = keys[name]
        pearson = [keys[f"{CURVES[2][0]}_{a}"] for a in "xy" if f"{CURVES[2][0]}_{a}" in keys]
        if pearson:
            curves[CURVES[2][0]][k] = sum(pearson) / len(pearson)
    if not by_shift:
        return {}
    best = report.get(f"{prefix}/best_shift_bins")
    curves["best"] = {} if best is None else {int(best): float(best)}
    return curves


def draw_latency_curve(report: dict, bin_ms: float, title: str = "D2E latency curve", prefix: str = "d2e"):
    """The figure of `latency_curve` (None when no shift has a score): one line per curve (``gid`` ``latency:{curve}``),
    x in bins below and ms above, the best shift a vertical line (``gid`` ``latency:best``)."""
    curves = latency_curve(report, prefix)
    if not any(curves.get(name) for name, _ in CURVES):
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(4.8, 2.8), dpi=100)
    ax = fig.subplots()
    for (name, words), marker in zip(CURVES, "os^"):
        points = curves[name]
        if points:
            ax.plot(list(points), list(points.values()), marker=marker, markersize=3.5, linewidth=1.1, label=words,
                    gid=f"latency:{name}")
    for k in curves["best"]:
        ax.axvline(k, color="#d62728", linestyle="--", linewidth=1, gid="latency:best",
                   label=f"best shift {k:+d} bins ({k * bin_ms:+g} ms)")
    ax.axhline(0, color="#bbbbbb", linewidth=0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("shift k (bins): true bin i vs predicted bin i + k", fontsize=7.5)
    ax.set_ylabel("score", fontsize=7.5)
    ax.tick_params(labelsize=7)
    top = ax.secondary_xaxis("top", functions=(lambda k: k * bin_ms, lambda ms: ms / bin_ms))
    top.set_xlabel("shift (ms)", fontsize=7.5)
    top.tick_params(labelsize=7)
    ax.set_title(title, fontsize=8, fontweight="bold")
    ax.legend(fontsize=6.5, frameon=False)
    fig.subplots_adjust(left=0.11, right=0.98, top=0.78, bottom=0.15)
    return fig
