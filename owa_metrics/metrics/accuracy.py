"""Discrete metrics: digit precision, keyboard and mouse action accuracy (running sums, synced by sum)."""

from __future__ import annotations

from typing import Optional

import torch

from ..functional.declare import SUM_PARTS
from ..functional.events import (
    digit_precision_sums, keyboard_report, keyboard_sums, mouse_action_report, mouse_action_sums, ratio,
)
from ..tokens.codec import CodecConfig
from .base import Float64Metric, check_same_shape


class _SumMetric(Float64Metric):
    """A metric whose state is one float64 vector of running sums, named after what it sums (``name``: unique per
    class, so that a ``MetricCollection`` never merges two metrics' states into one compute group)."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    plot_lower_bound, plot_upper_bound = 0.0, 1.0

    def __init__(self, name: str, size: int, **kwargs):
        super().__init__(**kwargs)
        self.add_state(name, default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")

    def plot(self, val=None, ax=None):
        return self._plot(val, ax)


class DigitPrecisionAccuracy(_SumMetric):
    """p1..pk: p_j = fraction of samples whose digits 1..j all match (p1 >= p2 >= ...).

    ``update(pred_digits, target_digits)`` with [N, k] digit tensors, or [N, k, m] for a joint field (e.g. the
    mouse vector: dx and dy digits stacked, p_j = both match through digit j). ``compute()`` -> tensor [k].
    ``DigitPrecisionAccuracy(field="dx", format="factorized")`` takes k from the format (there 5: the sign
    token, then 4 digits); ``field`` is ``timestamp``, ``dx`` or ``dy``.
    """

    def __init__(self, num_digits: Optional[int] = None, *, field: Optional[str] = None, format: str = "hierarchical",
                 **kwargs):
        if num_digits is None:
            if field not in ("timestamp", "dx", "dy"):
                raise ValueError("DigitPrecisionAccuracy needs num_digits, or field='timestamp' | 'dx' | 'dy' (with format=)")
            num_digits = CodecConfig.preset(format).token_format.digit_columns.count(field)
        super().__init__("digit_prefix_sums", num_digits + 1, **kwargs)
        self.num_digits = num_digits

    def sync_settings(self) -> dict:
        return {**super().sync_settings(), "num_digits": self.num_digits}

    def update(self, pred_digits: torch.Tensor, target_digits: torch.Tensor) -> None:
        if pred_digits.shape != target_digits.shape or pred_digits.shape[1:2] != (self.num_digits,):
            raise ValueError(f"expected digit tensors [N, {self.num_digits}(, m)], got {tuple(pred_digits.shape)} "
                             f"and {tuple(target_digits.shape)}")
        self.digit_prefix_sums += digit_precision_sums(pred_digits, target_digits)

    def compute(self) -> torch.Tensor:
        return ratio(self.digit_prefix_sums[:-1], self.digit_prefix_sums[-1])


class KeyboardAccuracy(_SumMetric):
    """Over keyboard events: ``vk_accuracy``, ``action_accuracy`` (press/release) and ``accuracy`` (both).

    Per event (each event weighs the same); with ``seq_idx`` also ``accuracy_seq_macro``: the mean over
    sequences of each sequence's accuracy (each sequence weighs the same). Inputs: one shape [N].
    """

    def __init__(self, **kwargs):
        super().__init__("keyboard_sums", 5 + SUM_PARTS, **kwargs)

    def update(self, pred_vk, pred_action, target_vk, target_action, seq_idx: Optional[torch.Tensor] = None) -> None:
        extra = {} if seq_idx is None else {"seq_idx": seq_idx}
        check_same_shape(self, pred_vk=pred_vk, pred_action=pred_action, target_vk=target_vk,
                         target_action=target_action, **extra)
        num_sequences = int(seq_idx.max()) + 1 if seq_idx is not None and seq_idx.numel() else 0
        self.keyboard_sums += keyboard_sums(pred_vk, pred_action, target_vk, target_action, seq_idx, num_sequences)

    def compute(self) -> dict[str, torch.Tensor]:
        return keyboard_report(self.keyboard_sums)


class MouseActionAccuracy(_SumMetric):
    """``action_accuracy``: predicted button_flags right, over events whose true flags != 0;
    ``scroll_accuracy``: predicted button_data right, over events whose true button_data != 0. Inputs: one shape [N]."""

    def __init__(self, **kwargs):
        super().__init__("mouse_action_sums", 4, **kwargs)

    def update(self, pred_flags, pred_data, target_flags, target_data) -> None:
        check_same_shape(self, pred_flags=pred_flags, pred_data=pred_data, target_flags=target_flags,
                         target_data=target_data)
        self.mouse_action_sums += mouse_action_sums(pred_flags, pred_data, target_flags, target_data)

    def compute(self) -> dict[str, torch.Tensor]:
        return mouse_action_report(self.mouse_action_sums)
