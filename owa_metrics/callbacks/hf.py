"""The event metrics inside ``transformers.Trainer``: ``compute_metrics``, with ``batch_eval_metrics`` on or off."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..functional.tokens import per_token_loss
from ..metrics.collection import OWAEventMetrics


class OWAEventMetricsForTrainer:
    """``Trainer(..., compute_metrics=m, preprocess_logits_for_metrics=m.preprocess_logits_for_metrics)`` with
    ``m = OWAEventMetricsForTrainer(tokenizer)``; ``batch_eval_metrics`` on (each batch scored as it comes) or off
    (the Trainer's default: it calls ``m`` once with the whole gathered, -100-padded set), the same report.

    ``preprocess_logits_for_metrics`` runs on each process, on the model's device: the argmax ids and, with
    ``log_loss``, the per-token cross-entropy (`per_token_loss`, label t + 1's at t), so that only two numbers a
    token travel and the per-category loss keys exist. The Trainer gathers them with the labels across processes
    and calls this object on every rank with the gathered data: the metric therefore never syncs its states
    itself (``sync_on_compute=False``), which would count every event world-size times. Labels follow the HF
    convention (logits at t predict label t + 1) and are shifted here; the Trainer's -100 padding reads as
    ignored. Without ``preprocess_logits_for_metrics`` the Trainer hands over the logits, which are scored as
    they are (argmax and loss here, after gathering them all). ``format=`` / ``config=`` and the other keywords
    go to `OWAEventMetrics` (by default the format is detected from the tokenizer).
    """

    def __init__(self, tokenizer, prefix: str = "owa/", log_loss: bool = True, **metric_kwargs: Any):
        if metric_kwargs.get("pairing", "index") != "index" or metric_kwargs.get("alignment", "teacher_forcing") != \
                "teacher_forcing":
            raise ValueError("OWAEventMetricsForTrainer scores the Trainer's teacher-forced logits, where every "
                             "position pairs with itself: alignment / pairing do not apply. To pair generated events "
                             "by time use OWAEventMetrics(tokenizer, alignment='generation', pairing='time') on "
                             "generated ids, or OWAEventMetricsCallback(..., alignment='generation', pairing='time')")
        if metric_kwargs.get("tags"):
            raise ValueError("the HF Trainer gives compute_metrics no tag per sequence: slice by tags with "
                             "OWAEventMetricsCallback (Lightning) or OWAEventMetrics(tokenizer, tags=...) yourself")
        self.metric = OWAEventMetrics(tokenizer, sync_on_compute=False, **metric_kwargs)
        self.prefix, self.log_loss = prefix, log_loss

    def preprocess_logits_for_metrics(self, logits, labels):
        """Argmax ids [B, T] and, with ``log_loss``, the per-token loss [B, T] (its last column 0)."""
        if isinstance(logits, tuple):  # models that return extra outputs
            logits = logits[0]
        ids = logits.argmax(-1)
        if not self.log_loss:
            return ids
        return ids, torch.nn.functional.pad(per_token_loss(logits[:, :-1], labels[:, 1:]), (0, 1))

    def __call__(self, eval_pred, compute_result: Optional[bool] = None) -> dict[str, float]:
        """``compute_result`` None: the Trainer's one call with every prediction (``batch_eval_metrics`` off);
        False / True: one batch of ``batch_eval_metrics``, True the last (then the report)."""
        predictions, token_loss = eval_pred.predictions, None
        if isinstance(predictions, (tuple, list)):
            predictions, token_loss = predictions[0], predictions[1] if len(predictions) > 1 else None
        preds, labels = (torch.as_tensor(x) for x in (predictions, eval_pred.label_ids))
        self.metric = self.metric.to(labels.device)
        target, loss = labels[:, 1:], {}
        if preds.is_floating_point():  # logits: no preprocess_logits_for_metrics
            loss = {"logits": preds[:, :-1]} if self.log_loss else {}
            preds = preds.argmax(-1)
        elif token_loss is not None:
            loss = {"token_loss": torch.as_tensor(token_loss)[:, :-1]}
        self.metric.update(preds[:, :-1], target, **loss)
        if compute_result is False:
            return {}
        report = {self.prefix + k: float(v) for k, v in self.metric.compute().items()}
        self.metric.reset()
        return report
