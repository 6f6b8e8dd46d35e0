"""Discrete metrics: digit precision, keyboard and mouse action accuracy (running sums, synced by sum)."""

from __future__ import annotations

from typing import Optional

import torch
from torchmetrics import Metric

from ..functional.events import digit_matches


class _SumMetric(Metric):
    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    plot_lower_bound, plot_upper_bound = 0.0, 1.0

    def _add_sums(self, *names: str, shape=()) -> None:
        for name in names:
            self.add_state(name, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def plot(self, val=None, ax=None):
        return self._plot(val, ax)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1), torch.full_like(num, float("nan")))


def _per_sequence(correct: torch.Tensor, seq_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over sequences of each sequence's accuracy, number of sequences with samples)."""
    if seq_idx.numel() == 0:
        return torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    total = torch.bincount(seq_idx, minlength=int(seq_idx.max()) + 1).double()
    hits = torch.bincount(seq_idx, weights=correct.double(), minlength=total.numel())
    seen = total > 0
    return (hits[seen] / total[seen]).sum(), seen.sum().double()


class DigitPrecisionAccuracy(_SumMetric):
    """p1..pk: p_j = fraction of samples whose digits 1..j all match (p1 >= p2 >= ...).

    ``update(pred_digits, target_digits)`` with [N, k] digit tensors, or [N, k, m] for a joint field (e.g. the
    mouse vector: dx and dy digits stacked, p_j = both match through digit j). ``compute()`` -> tensor [k].
    """

    def __init__(self, num_digits: int, **kwargs):
        super().__init__(**kwargs)
        self.num_digits = num_digits
        self._add_sums("matches", shape=(num_digits,))
        self._add_sums("total")

    def update(self, pred_digits: torch.Tensor, target_digits: torch.Tensor) -> None:
        if pred_digits.shape != target_digits.shape or pred_digits.shape[1:2] != (self.num_digits,):
            raise ValueError(f"expected digit tensors [N, {self.num_digits}(, m)], got {tuple(pred_digits.shape)} "
                             f"and {tuple(target_digits.shape)}")
        self.matches += digit_matches(pred_digits, target_digits).sum(dim=0)
        self.total += pred_digits.shape[0]

    def compute(self) -> torch.Tensor:
        return _ratio(self.matches, self.total)


class KeyboardAccuracy(_SumMetric):
    """Over keyboard events: ``vk_accuracy``, ``action_accuracy`` (press/release) and ``accuracy`` (both).

    Per event (each event weighs the same); with ``seq_idx`` also ``accuracy_seq_macro``: the mean over
    sequences of each sequence's accuracy (each sequence weighs the same).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sums("vk", "action", "both", "total", "seq_sum", "seq_count")

    def update(self, pred_vk, pred_action, target_vk, target_action, seq_idx: Optional[torch.Tensor] = None) -> None:
        vk, action = pred_vk == target_vk, pred_action == target_action
        self.vk += vk.sum()
        self.action += action.sum()
        self.both += (vk & action).sum()
        self.total += vk.numel()
        if seq_idx is not None:
            seq_sum, seq_count = _per_sequence(vk & action, seq_idx)
            self.seq_sum += seq_sum.to(self.device)
            self.seq_count += seq_count.to(self.device)

    def compute(self) -> dict[str, torch.Tensor]:
        return {"accuracy": _ratio(self.both, self.total), "vk_accuracy": _ratio(self.vk, self.total),
                "action_accuracy": _ratio(self.action, self.total),
                "accuracy_seq_macro": _ratio(self.seq_sum, self.seq_count)}


class MouseActionAccuracy(_SumMetric):
    """``action_accuracy``: predicted button_flags right, over events whose true flags != 0;
    ``scroll_accuracy``: predicted button_data right, over events whose true button_data != 0."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sums("flags_right", "flags_total", "scroll_right", "scroll_total")

    def update(self, pred_flags, pred_data, target_flags, target_data) -> None:
        acts, scrolls = target_flags != 0, target_data != 0
        self.flags_right += ((pred_flags == target_flags) & acts).sum()
        self.flags_total += acts.sum()
        self.scroll_right += ((pred_data == target_data) & scrolls).sum()
        self.scroll_total += scrolls.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {"action_accuracy": _ratio(self.flags_right, self.flags_total),
                "scroll_accuracy": _ratio(self.scroll_right, self.scroll_total)}
