"""Event-level metrics over an `EventBatch`: comparability, category ratios and confusion, counts; tokens."""

from __future__ import annotations

import torch

from ..decode.event_batch import EventBatch
from ..schema import CATEGORY_NAMES, Status
from ..functional.events import EVENT_COUNTS, event_type_report
from ..functional.report import event_type_sums
from ..functional.tokens import TOKEN_FIELDS, EventTokenStats, token_report, token_sums
from .accuracy import _SumMetric

N_CAT = len(CATEGORY_NAMES)


class EventTypeMetrics(_SumMetric):
    """How the predicted events line up with the target events (see `event_type_report`):

    ``comparable_rate`` (per event) and ``comparable_rate_seq_macro`` (per sequence), ``{cat}/ratio``,
    ``{cat}/comparable_rate``, ``category/macro_f1`` over the confusion matrix target x predicted category
    (+ an ``invalid`` column), ``count_accuracy`` (generation), and counts. ``update(batch: EventBatch)``.
    """

    def __init__(self, **kwargs):
        super().__init__("event_type_sums", N_CAT * (N_CAT + 1) + len(Status) + len(EVENT_COUNTS), **kwargs)

    def update(self, batch: EventBatch) -> None:
        _check_type(self, batch, EventBatch, "owa_metrics.decode_batch(preds, target, vocab)")
        self.event_type_sums += torch.cat([part.reshape(-1) for part in event_type_sums(batch)])

    @property
    def confusion(self) -> torch.Tensor:
        return self.event_type_sums[:N_CAT * (N_CAT + 1)].view(N_CAT, N_CAT + 1)

    def compute(self) -> dict[str, torch.Tensor]:
        cut, sums = N_CAT * (N_CAT + 1), self.event_type_sums
        return event_type_report(self.confusion, sums[cut:cut + len(Status)], sums[cut + len(Status):])


class EventTokenMetrics(_SumMetric):
    """Token-level view of the target events under teacher forcing (see `token_report`): per-field token
    accuracy, and the per-category token loss when logits were given. ``update(stats: EventTokenStats)``."""

    def __init__(self, **kwargs):
        super().__init__("token_sums", 2 * len(TOKEN_FIELDS) + 2 * (N_CAT + 1), **kwargs)

    def update(self, stats: EventTokenStats) -> None:
        _check_type(self, stats, EventTokenStats,
                    "owa_metrics.functional.tokens.event_token_stats(batch, preds, target, config, logits)")
        fields, loss = token_sums(stats)
        self.token_sums += torch.cat([fields.reshape(-1), loss.reshape(-1)])

    def compute(self) -> dict[str, torch.Tensor]:
        n = 2 * len(TOKEN_FIELDS)
        return token_report(self.token_sums[:n].view(2, -1), self.token_sums[n:].view(2, -1))


def _check_type(metric, value, expected: type, build: str) -> None:
    if not isinstance(value, expected):
        raise TypeError(f"{type(metric).__name__}.update takes one {expected.__name__}, built by {build}; got "
                        f"{type(value).__name__}")
