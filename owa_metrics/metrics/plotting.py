"""What `OWAEventMetrics` shows besides its report: ``plot()`` of the headline keys (drawn with torchmetrics'
plotting, as every torchmetrics metric's), and the data the figures draw: the error histograms and the category
confusion counts (`owa_metrics.figures` draws the confusion, a layer above; the callbacks log the histograms)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..functional.report import WORDS, headline_keys, higher_is_better
from .shared_compute import Read


def plot(metric, val=None, ax=None, keys: Optional[Sequence[str]] = None):
    """Draw the headline keys (`headline_keys`, or ``keys``), a panel each with torchmetrics' plotting (its direction
    marked): a point for one result (``val``, else ``metric.compute()``), a line over steps for several (a list of
    results, or `MetricTracker.compute_all`'s stacked dict). ``ax``: one matplotlib axes per key. Returns
    ``(figure, axes)``."""
    import matplotlib.pyplot as plt
    from torchmetrics.utilities.plot import plot_single_or_multi_val

    val = metric.compute() if val is None else val
    steps = list(val) if isinstance(val, (list, tuple)) else None
    first = steps[0] if steps else val
    wanted = list(keys or headline_keys(metric.alignment))
    keys = [k for k in wanted if k in first]
    if not keys:
        raise ValueError(f"nothing to plot: the result holds none of the keys {wanted} (pass a report of "
                         "OWAEventMetrics.compute(), a list of them, or MetricTracker.compute_all()'s)")
    if ax is None:
        cols = min(4, len(keys))
        fig, ax = plt.subplots((len(keys) + cols - 1) // cols, cols, figsize=(3.2 * cols, 2.6 * -(-len(keys) // cols)),
                               squeeze=False)
        for extra in ax.flat[len(keys):]:
            extra.set_visible(False)
    else:
        fig = None
    axes = list(getattr(ax, "flat", ax if isinstance(ax, (list, tuple)) else [ax]))
    if len(axes) < len(keys):
        raise ValueError(f"plot(ax=...) needs one axes per key: {len(keys)} keys ({keys}), {len(axes)} axes")
    for key, panel in zip(keys, axes):
        series = [torch.as_tensor(s[key]) for s in steps] if steps else torch.as_tensor(first[key])
        if not steps and series.dim() == 1:  # compute_all's rows: one value per step
            series = list(series)
        plot_single_or_multi_val(series, ax=panel, higher_is_better=higher_is_better(key),
                                 name=key.rsplit("/", 1)[-1])
        panel.set_title(WORDS.get(key, key), fontsize=9)
    if fig is not None:
        fig.tight_layout()
    return fig or axes[0].figure, ax


def error_histograms(metric, bins: int = 50) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{name: (counts, edges)}`` of the signed timestamp error (ms), the mouse signed percent errors and the
    direction error (deg) over all ranks (call on every rank). The range shows the bulk: P2..P98 of the values,
    narrowed to Tukey's fences (Q1 - 1.5 IQR, Q3 + 1.5 IQR); values outside it count in the edge bins."""
    with metric.sync_context():
        read = Read(metric)
        named = {"timestamp/signed_error_ms": read.samples("timestamp", "signed_error_ms"),
                 "mouse/signed_pe_x_pct": read.samples("mouse", "signed_pe_x"),
                 "mouse/signed_pe_y_pct": read.samples("mouse", "signed_pe_y"),
                 "mouse/direction_error_deg": read.samples("mouse", "direction_deg")}
        out = {}
        for name, dist in named.items():
            if dist.count == 0:
                continue
            low, q1, q3, high = (float(v) for v in dist.quantile([0.02, 0.25, 0.75, 0.98]))
            if q3 > q1:
                low, high = max(low, q1 - 1.5 * (q3 - q1)), min(high, q3 + 1.5 * (q3 - q1))
            values, weights = (t.cpu().numpy() for t in dist.distinct())
            high = high if high > low else low + 1
            out[name] = np.histogram(np.clip(values, low, high), bins=bins, range=(low, high), weights=weights)
        return out


def confusion_matrix(metric, sync: bool = True) -> torch.Tensor:
    """Category confusion counts over all ranks (call on every rank; ``sync=False``: this process's alone, e.g. one
    rank's own pass): rows are the target categories (keyboard, mouse_op, mouse_nop, screen), columns the predicted
    ones and a last ``invalid`` column (`owa_metrics.figures.confusion_figure` draws them)."""
    with metric.sync_context(should_sync=sync):
        return Read(metric).given("confusion").clone()
