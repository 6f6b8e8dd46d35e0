"""The event metrics inside ``transformers.Trainer``: ``compute_metrics`` with ``batch_eval_metrics=True``."""

from __future__ import annotations

from typing import Any

import torch

from ..metrics.collection import OWAEventMetrics


class OWAEventMetricsForTrainer:
    """``Trainer(..., compute_metrics=m, preprocess_logits_for_metrics=m.preprocess_logits_for_metrics,
    args=TrainingArguments(..., batch_eval_metrics=True))`` with ``m = OWAEventMetricsForTrainer(tokenizer)``.

    The Trainer runs ``preprocess_logits_for_metrics`` on each process (argmax on the model's device, so only
    token ids travel), gathers predictions and labels across processes, and calls this object on every rank
    with the gathered batch: the metric therefore never syncs its states itself (``sync_on_compute=False``),
    which would count every event world-size times. Labels follow the HF convention (logits at t predict
    label t + 1) and are shifted here; the Trainer's -100 padding reads as ignored. ``format=`` / ``config=``
    and the other keywords go to `OWAEventMetrics` (by default the format is detected from the tokenizer).
    """

    def __init__(self, tokenizer, prefix: str = "owa/", **metric_kwargs: Any):
        if metric_kwargs.get("pairing", "index") != "index" or metric_kwargs.get("alignment", "teacher_forcing") != \
                "teacher_forcing":
            raise ValueError("OWAEventMetricsForTrainer scores the Trainer's teacher-forced logits, where every "
                             "position pairs with itself: alignment / pairing do not apply. To pair generated events "
                             "by time use OWAEventMetrics(tokenizer, alignment='generation', pairing='time') on "
                             "generated ids, or OWAEventMetricsCallback(..., alignment='generation', pairing='time')")
        self.metric = OWAEventMetrics(tokenizer, sync_on_compute=False, **metric_kwargs)
        self.prefix = prefix

    @staticmethod
    def preprocess_logits_for_metrics(logits, labels) -> torch.Tensor:
        if isinstance(logits, tuple):  # models that return extra outputs
            logits = logits[0]
        return logits.argmax(-1)

    def __call__(self, eval_pred, compute_result: bool = False) -> dict[str, float]:
        preds, labels = (torch.as_tensor(x) for x in (eval_pred.predictions, eval_pred.label_ids))
        self.metric = self.metric.to(labels.device)
        self.metric.update(preds[:, :-1], labels[:, 1:])
        if not compute_result:
            return {}
        report = {self.prefix + k: float(v) for k, v in self.metric.compute().items()}
        self.metric.reset()
        return report
