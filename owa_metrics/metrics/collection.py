"""`OWAEventMetrics`: the whole report — decode once per batch, feed every metric, one flat dict out."""

from __future__ import annotations

import warnings
from typing import Optional, Union

import torch
from torchmetrics import Metric

from ..decode.batch import Alignment, EventBatch, decode_batch
from ..events.event import CATEGORY_NAMES, Kind, Status
from ..functional.tokens import event_token_stats
from ..tokens.codec import CodecConfig
from ..tokens.vocab import VocabMap
from .accuracy import DigitPrecisionAccuracy, KeyboardAccuracy, MouseActionAccuracy
from .base import Mode
from .errors import (
    IQMPE, DirectionError, EuclideanPercentError, MovementR2, SignedPercentError, TimestampError,
)
from .events import EventTypeMetrics, EventTokenMetrics


class OWAEventMetrics(Metric):
    """Every event metric of an OWA model, as one torchmetrics ``Metric``.

    ``OWAEventMetrics(tokenizer)`` takes any HF tokenizer that has the event tokens (or ``vocab=VocabMap``).
    ``update(preds, target, logits=None)``: token ids [B, T] aligned position by position (teacher forcing:
    see `align_teacher_forcing`; generation: ``alignment="generation"``, ``preds`` the generated tokens), or an
    already decoded `EventBatch` as ``preds``; ``logits`` [B, T, V] aligned with ``target`` add the per-category
    token loss. ``compute()`` -> a flat dict of float64 scalars with ``/``-grouped keys and units in the names;
    keys without samples are left out (never NaN), counts are always there.

    Aggregates are per event (each event weighs the same, as the OWA metric spec); keys ending in
    ``_seq_macro`` are per-sequence macro averages (each sequence weighs the same). Quantile-based metrics
    keep every sample (``mode="exact"``) or a fixed-size sketch (``mode="sketch"``, see `SampleMetric`).
    Each child metric syncs its own state under DDP; call ``compute()`` on every rank.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = None

    def __init__(self, tokenizer=None, *, vocab: Optional[VocabMap] = None, config: Optional[CodecConfig] = None,
                 alignment: Alignment = "teacher_forcing", mode: Mode = "exact", relative_accuracy: float = 0.005,
                 num_resamples: int = 1000, seed: int = 42, **kwargs):
        super().__init__(**kwargs)
        if vocab is None:
            if tokenizer is None:
                raise ValueError("OWAEventMetrics needs the model's tokenizer (with the event tokens) or vocab=VocabMap")
            vocab = VocabMap.from_tokenizer(tokenizer, config)
        self.vocab, self.alignment = vocab, alignment
        window_ns = vocab.config.timestamp_window_ns
        dist = dict(mode=mode, relative_accuracy=relative_accuracy, num_resamples=num_resamples, seed=seed)
        n_ts, n_delta = len(vocab.config.timestamp_bases), len(vocab.config.mouse_delta_bases)
        self.events = EventTypeMetrics()
        self.tokens = EventTokenMetrics()
        self.timestamp = torch.nn.ModuleDict(
            {name: TimestampError(window_ns=window_ns, **dist) for name in ("all", *CATEGORY_NAMES)})
        self.timestamp_precision = torch.nn.ModuleDict(
            {name: DigitPrecisionAccuracy(n_ts) for name in ("all", *CATEGORY_NAMES)})
        self.keyboard = KeyboardAccuracy()
        self.mouse_action = MouseActionAccuracy()
        self.mouse_euclidean = EuclideanPercentError(**dist)
        self.mouse_signed = torch.nn.ModuleDict({axis: SignedPercentError(**dist) for axis in ("x", "y")})
        self.mouse_iqmpe = torch.nn.ModuleDict({axis: IQMPE(**dist) for axis in ("dx", "dy")})
        self.mouse_direction = DirectionError(**dist)
        self.mouse_precision = torch.nn.ModuleDict(
            {name: DigitPrecisionAccuracy(n_delta) for name in ("dx", "dy", "euclidean")})
        self.mouse_r2 = MovementR2()

    def update(self, preds: Union[torch.Tensor, EventBatch], target: Optional[torch.Tensor] = None,
               logits: Optional[torch.Tensor] = None) -> None:
        if isinstance(preds, EventBatch):
            batch = preds
        else:
            if target is None:
                raise ValueError("update(preds, target): target token ids are missing")
            batch = decode_batch(preds, target, self.vocab, self.alignment)
            if self.alignment == "teacher_forcing":
                if logits is not None and logits.shape[:-1] != target.shape:
                    raise ValueError(f"logits {tuple(logits.shape)} must be [B, T, V] aligned with target "
                                     f"{tuple(target.shape)}")
                self.tokens.update(event_token_stats(batch, preds.reshape(target.shape), target,
                                                     self.vocab.config, logits))
        self.events.update(batch)
        tgt, pred = batch.target, batch.pred
        comparable = batch.comparable

        def take(mask: torch.Tensor):
            index = mask.nonzero().squeeze(1)
            return lambda x: x.index_select(0, index)

        rows = take(comparable)
        self.timestamp["all"].update(rows(pred.timestamp_ns), rows(tgt.timestamp_ns))
        self.timestamp_precision["all"].update(rows(pred.timestamp_digits), rows(tgt.timestamp_digits))
        for i, name in enumerate(CATEGORY_NAMES):
            rows = take(comparable & (tgt.category == i))
            self.timestamp[name].update(rows(pred.timestamp_ns), rows(tgt.timestamp_ns))
            self.timestamp_precision[name].update(rows(pred.timestamp_digits), rows(tgt.timestamp_digits))

        rows = take(comparable & (tgt.kind == int(Kind.KEYBOARD)))
        self.keyboard.update(rows(pred.vk), rows(pred.action), rows(tgt.vk), rows(tgt.action), rows(batch.seq_idx))

        rows = take(comparable & (tgt.kind == int(Kind.MOUSE)))
        p_xy, t_xy = rows(torch.stack([pred.dx, pred.dy], 1)), rows(torch.stack([tgt.dx, tgt.dy], 1))
        self.mouse_action.update(rows(pred.button_flags), rows(pred.button_data), rows(tgt.button_flags),
                                 rows(tgt.button_data))
        self.mouse_euclidean.update(p_xy, t_xy)
        self.mouse_direction.update(p_xy, t_xy)
        self.mouse_r2.update(p_xy, t_xy)
        for i, (axis, name) in enumerate((("x", "dx"), ("y", "dy"))):
            self.mouse_signed[axis].update(p_xy[:, i], t_xy[:, i])
            self.mouse_iqmpe[name].update(p_xy[:, i], t_xy[:, i])
        p_digits, t_digits = rows(torch.stack([pred.dx_digits, pred.dy_digits], 2)), rows(
            torch.stack([tgt.dx_digits, tgt.dy_digits], 2))
        self.mouse_precision["dx"].update(p_digits[..., 0], t_digits[..., 0])
        self.mouse_precision["dy"].update(p_digits[..., 1], t_digits[..., 1])
        self.mouse_precision["euclidean"].update(p_digits, t_digits)

    def compute(self) -> dict[str, torch.Tensor]:
        with warnings.catch_warnings():  # a child that saw no samples (e.g. no keyboard events) is expected
            warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
            return self._compute()

    def _compute(self) -> dict[str, torch.Tensor]:
        out = dict(self.events.compute())
        if self.alignment == "teacher_forcing":
            out.update(self.tokens.compute())
        for name, metric in self.timestamp.items():
            prefix = "timestamp" if name == "all" else f"{name}/timestamp"
            out.update({f"{prefix}/{k}": v for k, v in metric.compute().items()})
            out.update(_levels(f"{prefix}/precision", self.timestamp_precision[name].compute()))
        out.update({f"keyboard/{k}": v for k, v in self.keyboard.compute().items()})
        out.update({f"mouse/{k}": v for k, v in self.mouse_action.compute().items()})
        euclidean = self.mouse_euclidean.compute()
        out["mouse/euclidean_pe_p95_pct"] = euclidean["p95_pct"]
        out["mouse/euclidean_iqmpe_pct"] = euclidean["iqmpe_pct"]
        for axis, metric in self.mouse_signed.items():
            res = metric.compute()
            out[f"mouse/signed_pe_{axis}_iqm_pct"] = res["iqm_pct"]
            out[f"mouse/signed_pe_{axis}_ci_low_pct"] = res["ci_low_pct"]
            out[f"mouse/signed_pe_{axis}_ci_high_pct"] = res["ci_high_pct"]
        for name, metric in self.mouse_iqmpe.items():
            out[f"mouse/{name}_iqmpe_pct"] = metric.compute()
        direction = self.mouse_direction.compute()
        out["mouse/direction_error_p50_deg"] = direction["p50_deg"]
        out["mouse/direction_error_p95_deg"] = direction["p95_deg"]
        for name, metric in self.mouse_precision.items():
            out.update(_levels(f"mouse/{name}_precision", metric.compute()))
        out["mouse/r2"] = self.mouse_r2.compute()
        return {k: v.double().to(self.device) for k, v in out.items() if not bool(torch.isnan(v))}

    def confusion_matrix(self) -> torch.Tensor:
        """Category confusion counts over all ranks (call on every rank): rows are the target categories
        (keyboard, mouse_op, mouse_nop, screen), columns the predicted ones and a last ``invalid`` column."""
        with self.events.sync_context():
            return self.events.confusion.clone()

    def metrics(self) -> dict[str, Metric]:
        """The child metrics by dotted name (``timestamp.all``, ``mouse_signed.x``, ...)."""
        out = {}
        for name, child in self.named_children():
            items = child.items() if isinstance(child, torch.nn.ModuleDict) else [("", child)]
            out.update({f"{name}.{key}" if key else name: metric for key, metric in items})
        return out

    def reset(self) -> None:
        super().reset()
        for metric in self.metrics().values():
            metric.reset()

    def merge_state(self, incoming_state: "OWAEventMetrics") -> None:
        """Merge another `OWAEventMetrics`' states into this one (child by child)."""
        if not isinstance(incoming_state, OWAEventMetrics):
            raise ValueError(f"expected an OWAEventMetrics to merge, got {type(incoming_state).__name__}")
        theirs = incoming_state.metrics()
        for name, metric in self.metrics().items():
            metric.merge_state(theirs[name])
        self._update_count += incoming_state._update_count
        self._computed = None


def _levels(prefix: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"{prefix}_p{j + 1}": v for j, v in enumerate(values)}
