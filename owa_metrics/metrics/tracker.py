"""`OWAMetricTracker`: torchmetrics' `MetricTracker` whose ``compute_all`` and ``best_metric`` read a report whose
keys change between steps, and each key's direction."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torchmetrics.wrappers import MetricTracker


class OWAMetricTracker(MetricTracker):
    """torchmetrics' ``MetricTracker`` (``increment``, ``update``, ``compute``, ``plot``, all its own) for a metric
    whose result is a dict and whose ``higher_is_better`` is a dict per key (`OWAEventMetrics`: a `KeyDirections`).

    A report leaves out the keys without samples, so its keys change between steps (an early model has nothing
    comparable). ``compute_all`` stacks the union of the keys over the steps (first seen first), NaN at a step
    without the key. ``best_metric`` takes, for each key of that union, over the steps that have it, the maximum
    where higher is better, the minimum where lower is, and None (as torchmetrics for a metric without a best)
    where neither (counts, shares, signed errors); its step counts every step. torchmetrics' own stacks step 0's
    keys only (a later key is dropped, a key a later step lacks raises ``KeyError``) and compares a dict as one
    tensor. ``maximize`` defaults to the metric's ``higher_is_better``; a bool there sets every key's."""

    def compute_all(self):
        steps = self._steps()
        if steps is None:
            return super().compute_all()
        return {key: torch.stack([step.get(key, torch.full_like(first, torch.nan)) for step in steps])
                for key, first in _union(steps).items()}

    def best_metric(self, return_step: bool = False):
        steps = self._steps()
        if steps is None:
            return super().best_metric(return_step)
        directions = self.maximize if isinstance(self.maximize, Mapping) else _Fixed(bool(self.maximize))
        value, step = {}, {}
        for key in _union(steps):
            better = directions[key]
            if better is None:
                value[key] = step[key] = None
                continue
            have = [(i, s[key].item()) for i, s in enumerate(steps) if key in s]
            step[key], value[key] = (max if better else min)(have, key=lambda pair: pair[1])  # ties: the first
        return (value, step) if return_step else value

    def _steps(self) -> list[dict] | None:
        """Each step's report, or None for a metric without a direction per key (torchmetrics' own then)."""
        if not isinstance(getattr(self._base_metric, "higher_is_better", None), Mapping):
            return None
        self._check_for_increment("compute_all")
        return [metric.compute() for metric in list(self)[1:]]


def _union(steps: list[dict]) -> dict:
    """Every key over the steps, first seen first, each with its first value (the NaN filler's dtype and device)."""
    out: dict = {}
    for step in steps:
        for key, value in step.items():
            out.setdefault(key, value)
    return out


class _Fixed(dict):
    """One direction for every key (``maximize=True`` / ``False`` given to the tracker)."""

    def __init__(self, better: bool):
        super().__init__()
        self.better = better

    def __missing__(self, key: str) -> bool:
        return self.better
