"""Seed 004's per-pair API: two event strings in, per-event comparison records and sequence aggregates out.

The readable path (string codec, one event at a time): use it to inspect a prediction; train with
`OWAEventMetrics`, which computes the same quantities vectorized.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..schema import Event, Status
from ..functional.stats import iqm
from ..tokens.codec import CodecConfig, EventCodec
from ..tokens.vocab import resolve_config

TYPE_NAMES = {"keyboard": "keyboard", "mouse": "mouse/raw", "screen": "screen"}


def compute_metrics_for_event(prediction: str, ground_truth: str, config: Optional[CodecConfig] = None,
                              format: Optional[str] = None) -> dict:
    """Compare the k-th predicted event with the k-th true event of two token strings.

    Returns ``event_comparisons`` (one record per true event: position, comparable, comparison_status,
    types, timestamp percent error and digit matches, per-kind field errors) and the sequence level:
    counts, ``count_accuracy`` (1.0 when the counts match), ``comparable_rate``, ``type_accuracy``, and
    ``timestamp_metrics`` / ``mouse_metrics`` / ``keyboard_metrics`` / ``screen_metrics`` aggregated over
    comparable events. Loss fields are None (no logits here); statistics without samples are None.
    """
    for name, text in (("prediction", prediction), ("ground_truth", ground_truth)):
        if not isinstance(text, str):
            raise TypeError(f"compute_metrics_for_event compares two token strings: {name} is a "
                            f"{type(text).__name__}; decode ids first (tokenizer.decode(ids)) or, for id tensors, "
                            "use OWAEventMetrics")
    codec = EventCodec(resolve_config(config, format))
    preds = list(codec.iter_decode(prediction))
    truths = list(codec.iter_decode(ground_truth))
    comparisons = []
    for i, truth in enumerate(truths):
        pred = preds[i] if i < len(preds) else None
        if truth.status != Status.VALID:
            status = Status.INVALID_TARGET
        elif pred is None:
            status = Status.MISSING
        elif pred.status != Status.VALID:
            status = pred.status
        else:
            status = Status.VALID if pred.event.kind == truth.event.kind else Status.TYPE_MISMATCH
        record = {
            "position": i, "comparable": status == Status.VALID, "comparison_status": status.label,
            "predicted_type": TYPE_NAMES[pred.event.kind] if pred is not None and pred.event else None,
            "ground_truth_type": TYPE_NAMES[truth.event.kind] if truth.event else None,
            "timestamp_percent_error": None, "timestamp_error_ms": None, "timestamp_precision_match": None,
            "mouse_metrics": None, "keyboard_metrics": None, "screen_metrics": None,
        }
        if status == Status.VALID:
            record.update(compare_events(codec, pred.event, truth.event))
        comparisons.append(record)

    comparable = [r for r in comparisons if r["comparable"]]
    valid_truths = [r for r in comparisons if r["ground_truth_type"] is not None]
    both_decoded = [r for r in valid_truths if r["predicted_type"] is not None]
    by_type = {name: [r for r in comparable if r["ground_truth_type"] == name] for name in TYPE_NAMES.values()}
    totals = {name: sum(r["ground_truth_type"] == name for r in valid_truths) for name in TYPE_NAMES.values()}
    ts_levels = codec.format.digit_columns.count("timestamp")
    delta_levels = codec.format.digit_columns.count("dx")

    def timestamp_part(records):
        return {"timestamp_iqmpe": _iqm([r["timestamp_percent_error"] for r in records]),
                "timestamp_precision_accuracy": _precision([r["timestamp_precision_match"] for r in records], ts_levels)}

    mouse = by_type["mouse/raw"]
    keyboard = by_type["keyboard"]
    return {
        "event_comparisons": comparisons,
        "predicted_count": len(preds),
        "ground_truth_count": len(truths),
        "count_accuracy": float(len(preds) == len(truths)),
        "comparable_rate": _mean([r["comparable"] for r in valid_truths]),
        "type_accuracy": _mean([r["predicted_type"] == r["ground_truth_type"] for r in both_decoded]),
        "timestamp_metrics": {
            "iqmpe": _iqm([r["timestamp_percent_error"] for r in comparable]),
            "precision_accuracy": _precision([r["timestamp_precision_match"] for r in comparable], ts_levels),
            "count": len(comparable),
        },
        "mouse_metrics": {
            **timestamp_part(mouse),
            **{f"{f}_iqmpe": _iqm([r["mouse_metrics"][f"{f}_percent_error"] for r in mouse])
               for f in ("dx", "dy", "euclidean")},
            **{f"{f}_precision_accuracy": _precision([r["mouse_metrics"][f"{f}_precision_match"] for r in mouse],
                                                     delta_levels) for f in ("dx", "dy", "euclidean")},
            "loss": None, "comparable_count": len(mouse), "total_count": totals["mouse/raw"],
        },
        "keyboard_metrics": {
            **timestamp_part(keyboard),
            "vk_accuracy": _mean([r["keyboard_metrics"]["vk_match"] for r in keyboard]),
            "action_accuracy": _mean([r["keyboard_metrics"]["action_match"] for r in keyboard]),
            "combined_accuracy": _mean([r["keyboard_metrics"]["combined_match"] for r in keyboard]),
            "loss": None, "comparable_count": len(keyboard), "total_count": totals["keyboard"],
        },
        "screen_metrics": {
            **timestamp_part(by_type["screen"]),
            "loss": None, "comparable_count": len(by_type["screen"]), "total_count": totals["screen"],
        },
    }


def compare_events(codec: EventCodec, pred: Event, truth: Event) -> dict:
    """Field comparisons of a comparable pair (same kind, both decoded): one event comparison record's fields."""
    c = codec.config
    window = c.timestamp_window_ns
    p_digits, t_digits = codec.digits(pred), codec.digits(truth)
    error_ns = (pred.timestamp_ns - truth.timestamp_ns + window // 2) % window - window // 2
    out = {
        "timestamp_error_ms": error_ns / 1e6,
        "timestamp_percent_error": _pe(abs(error_ns), truth.timestamp_ns),
        "timestamp_precision_match": _matches(p_digits["timestamp"], t_digits["timestamp"]),
    }
    if truth.kind == "mouse":
        dx_p, dx_t = p_digits["dx"], t_digits["dx"]
        dy_p, dy_t = p_digits["dy"], t_digits["dy"]
        norm = math.hypot(truth.dx, truth.dy)
        direction = None
        if norm:
            delta = abs(math.atan2(pred.dy, pred.dx) - math.atan2(truth.dy, truth.dx))
            direction = math.degrees(min(delta, 2 * math.pi - delta))
        out["mouse_metrics"] = {
            "dx_percent_error": _pe(abs(pred.dx - truth.dx), truth.dx),
            "dx_precision_match": _matches(dx_p, dx_t),
            "dy_percent_error": _pe(abs(pred.dy - truth.dy), truth.dy),
            "dy_precision_match": _matches(dy_p, dy_t),
            "euclidean_percent_error": math.hypot(pred.dx - truth.dx, pred.dy - truth.dy) / norm * 100 if norm else None,
            "euclidean_precision_match": _matches(list(zip(dx_p, dy_p)), list(zip(dx_t, dy_t))),
            "direction_error_deg": direction,
            "button_flags_match": pred.button_flags == truth.button_flags,
            "button_data_match": pred.button_data == truth.button_data,
            "loss": None,
        }
    elif truth.kind == "keyboard":
        vk, action = pred.vk == truth.vk, pred.action == truth.action
        out["keyboard_metrics"] = {"vk_match": vk, "action_match": action, "combined_match": vk and action,
                                   "loss": None}
    else:
        out["screen_metrics"] = {"loss": None}
    return out


def _pe(error: float, truth: float) -> Optional[float]:
    return abs(error) / abs(truth) * 100 if truth else None


def _matches(pred_digits: list, true_digits: list) -> dict:
    """``{"p1": ..., "pk": ...}``: p_j is True when digits 1..j all match."""
    out, ok = {}, True
    for j, (p, t) in enumerate(zip(pred_digits, true_digits)):
        ok = ok and p == t
        out[f"p{j + 1}"] = ok
    return out


def _mean(flags: list) -> Optional[float]:
    return sum(flags) / len(flags) if flags else None


def _iqm(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    value = float(iqm(torch.tensor(values, dtype=torch.float64))) if values else float("nan")
    return None if math.isnan(value) else value


def _precision(matches: list, levels: int) -> dict:
    return {f"p{j}": _mean([m[f"p{j}"] for m in matches]) for j in range(1, levels + 1)}
