"""`OWAMetricTracker`: torchmetrics' `MetricTracker` whose ``best_metric`` reads each key's direction."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torchmetrics.wrappers import MetricTracker


class OWAMetricTracker(MetricTracker):
    """torchmetrics' ``MetricTracker`` (``increment``, ``update``, ``compute``, ``compute_all``, ``plot``, all its
    own) for a metric whose result is a dict and whose ``higher_is_better`` is a dict per key (`OWAEventMetrics`:
    a `KeyDirections`): ``best_metric`` takes, for each key, the maximum over the steps where higher is better, the
    minimum where lower is, and None (as torchmetrics for a metric without a best) where neither (counts, shares,
    signed errors). torchmetrics' own ``best_metric`` compares a single metric's results as one tensor, which a
    dict is not. ``maximize`` defaults to the metric's ``higher_is_better``; a bool there sets every key's."""

    def best_metric(self, return_step: bool = False):
        directions = self.maximize
        if not isinstance(directions, Mapping):
            if not isinstance(self._base_metric.higher_is_better, Mapping):
                return super().best_metric(return_step)
            directions = _Fixed(bool(directions))
        value, step = {}, {}
        for key, series in self.compute_all().items():
            better = directions[key]
            if better is None:
                value[key] = step[key] = None
                continue
            best, at = (torch.max if better else torch.min)(series, 0)
            value[key], step[key] = best.item(), at.item()
        return (value, step) if return_step else value


class _Fixed(dict):
    """One direction for every key (``maximize=True`` / ``False`` given to the tracker)."""

    def __init__(self, better: bool):
        super().__init__()
        self.better = better

    def __missing__(self, key: str) -> bool:
        return self.better
