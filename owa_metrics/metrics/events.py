"""Event-level metrics: comparability, category ratios and confusion, counts; token loss and accuracy."""

from __future__ import annotations

from typing import Optional

import torch

from ..decode.batch import EventBatch
from ..events.event import CATEGORY_NAMES, Category, Status
from ..functional.events import macro_f1
from ..functional.tokens import TOKEN_FIELDS, EventTokenStats
from .accuracy import _per_sequence, _ratio, _SumMetric

N_CAT = len(CATEGORY_NAMES)


class EventTypeMetrics(_SumMetric):
    """How the predicted events line up with the target events of an `EventBatch`.

    Over target events that decode (invalid targets are counted apart, in ``count/invalid_target``):

    - ``comparable_rate``: comparable (both decode, same kind) / target events — per event;
      ``comparable_rate_seq_macro``: the mean over sequences of each sequence's rate — per sequence;
    - ``{cat}/ratio``: target events of the category / target events; ``{cat}/comparable_rate``: comparable
      ones among them;
    - ``category/macro_f1``: mean F1 over the categories of the confusion matrix target x predicted
      (``confusion``: 4 categories x 4 + an ``invalid`` column for predictions that do not decode);
    - ``count_accuracy``: sequences whose predicted event count equals the target's / sequences
      (generation; always 1 under teacher forcing), plus counts of events, extra and missing ones, statuses.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sums("confusion", shape=(N_CAT, N_CAT + 1))
        self._add_sums("statuses", shape=(len(Status),))
        self._add_sums("events", "sequences", "count_match", "pred_events", "extra", "missing", "seq_sum", "seq_count")

    def update(self, batch: EventBatch) -> None:
        valid = batch.target.status == int(Status.VALID)
        cell = batch.target.category.clamp(max=N_CAT - 1) * (N_CAT + 1) + batch.pred.category
        self.confusion += torch.bincount(cell, weights=valid.double(), minlength=N_CAT * (N_CAT + 1)).view(N_CAT, -1)
        self.statuses += torch.bincount(batch.status, minlength=len(Status)).double()
        self.events += len(batch)
        self.sequences += batch.num_sequences
        self.count_match += (batch.pred_count == batch.target_count).sum()
        self.pred_events += batch.pred_count.sum()
        self.extra += (batch.pred_count - batch.target_count).clamp(min=0).sum()
        self.missing += (batch.target_count - batch.pred_count).clamp(min=0).sum()
        seq_sum, seq_count = _per_sequence(batch.comparable[valid], batch.seq_idx[valid])
        self.seq_sum += seq_sum.to(self.device)
        self.seq_count += seq_count.to(self.device)

    def compute(self) -> dict[str, torch.Tensor]:
        per_cat = self.confusion.sum(dim=1)
        comparable_per_cat = self.confusion[:, :N_CAT]
        # comparable = same kind: the two mouse categories are comparable with each other
        mouse = [int(Category.MOUSE_OP), int(Category.MOUSE_NOP)]
        comparable = comparable_per_cat.diagonal().clone()
        comparable[mouse] = comparable_per_cat[mouse][:, mouse].sum(dim=1)
        valid_total = per_cat.sum()
        out = {
            "comparable_rate": _ratio(comparable.sum(), valid_total),
            "comparable_rate_seq_macro": _ratio(self.seq_sum, self.seq_count),
            "count_accuracy": _ratio(self.count_match, self.sequences),
            "category/macro_f1": macro_f1(self.confusion),
            "count/target_events": self.events, "count/valid_target_events": valid_total,
            "count/pred_events": self.pred_events, "count/comparable": comparable.sum(),
            "count/sequences": self.sequences, "count/extra_events": self.extra,
            "count/missing_events": self.missing,
        }
        for status in Status:
            out[f"status/{status.label}"] = self.statuses[int(status)]
        for i, cat in enumerate(CATEGORY_NAMES):
            out[f"{cat}/ratio"] = _ratio(per_cat[i], valid_total)
            out[f"{cat}/comparable_rate"] = _ratio(comparable[i], per_cat[i])
            out[f"{cat}/count"] = per_cat[i]
        return out


class EventTokenMetrics(_SumMetric):
    """Token-level view of the target events (teacher forcing), from `event_token_stats`:

    - ``{cat}/loss``: token cross-entropy summed over an event's tokens, averaged over the category's target
      events (all that decode, comparable or not); ``{cat}/loss_sum``: the total. Only when logits were given.
    - ``token_accuracy/{field}``: predicted token = target token, over the tokens of the field
      (timestamp digits, mouse delta digits, button flag digits, vk).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sums("loss_sum", "loss_events", shape=(N_CAT,))
        self._add_sums("field_correct", "field_total", shape=(len(TOKEN_FIELDS),))

    def update(self, stats: EventTokenStats) -> None:
        self.field_correct += stats.field_correct
        self.field_total += stats.field_total
        if stats.loss_sum is not None:
            self.loss_sum += torch.bincount(stats.category, weights=stats.loss_sum, minlength=N_CAT)
            self.loss_events += torch.bincount(stats.category, minlength=N_CAT).double()

    def compute(self) -> dict[str, torch.Tensor]:
        out = {f"token_accuracy/{name}": _ratio(self.field_correct[i], self.field_total[i])
               for i, name in enumerate(TOKEN_FIELDS)}
        for i, cat in enumerate(CATEGORY_NAMES):
            out[f"{cat}/loss"] = _ratio(self.loss_sum[i], self.loss_events[i])
            out[f"{cat}/loss_sum"] = torch.where(self.loss_events[i] > 0, self.loss_sum[i], float("nan"))
        return out
