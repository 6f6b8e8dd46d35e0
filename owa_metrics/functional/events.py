"""Per-event errors, running sums and reports: the functional twins of the metric classes.

Per-sample errors keep their input's length and are NaN where undefined (a zero ground truth); statistics
leave NaN out. ``*_sums`` give the additive state of a metric for one batch, ``*_report`` turn summed states
into results; the metric classes and `OWAEventMetrics` share them. A metric with no samples returns NaN.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..schema import CATEGORY_NAMES, Category, Status
from . import values
from .declare import ONE, SUM_PARTS, digit_prefix, exact_parts, exact_total
from .stats import abs_of_counts, bootstrap_iqm_ci_of_counts, distinct, iqm, iqm_of_counts, quantile, quantile_of_counts

N_CAT = len(CATEGORY_NAMES)
# seq_sum_{j}: the sum over sequences of their comparable rate, as `exact_parts`
EVENT_COUNTS = ("events", "sequences", "count_match", "pred_events", "extra", "missing",
                *(f"seq_sum_{j}" for j in range(SUM_PARTS)), "seq_count")


def finite(x: torch.Tensor) -> torch.Tensor:
    """The values that are not NaN."""
    return x[~torch.isnan(x)]


# ----------------------------------------------------------------------------------- per-sample errors
def percent_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``|pred - gt| / |gt| * 100`` (NaN where gt = 0)."""
    return values.of(values.PERCENT, **values.pair_leaves(*_flat(preds, target), "value"))


def signed_percent_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``(pred - gt) / gt * 100`` (NaN where gt = 0)."""
    return values.of(values.SIGNED_PERCENT, **values.pair_leaves(*_flat(preds, target), "value"))


def euclidean_percent_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``||p - g|| / ||g|| * 100`` of vectors [N, 2] (NaN where g = 0)."""
    return values.of(values.EUCLIDEAN_PERCENT, **_vector_leaves(preds, target))


def direction_error_deg(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Angle between vectors [N, 2] (dx, dy): ``min(|dθ|, 360 - |dθ|)`` via atan2 (NaN where g = 0)."""
    return values.of(values.DIRECTION_DEG, **_vector_leaves(preds, target))


def _flat(preds: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return preds.double().reshape(-1), target.double().reshape(-1)


def _vector_leaves(preds: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    preds, target = preds.double().reshape(-1, 2), target.double().reshape(-1, 2)
    return {**values.pair_leaves(preds[:, 0], target[:, 0], "dx"), **values.pair_leaves(preds[:, 1], target[:, 1], "dy")}


def wrapped_difference(preds: torch.Tensor, target: torch.Tensor, window: int) -> torch.Tensor:
    """Shortest signed difference ``pred - gt`` modulo ``window`` (in ``[-window/2, window/2)``)."""
    half = window // 2
    return torch.remainder(preds.long() - target.long() + half, window) - half


def timestamp_errors(preds_ns: torch.Tensor, target_ns: torch.Tensor, window_ns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(signed error ms, percent error)``: the wrap-aware error, and ``|error| / gt * 100`` with gt the true
    timestamp within the window (NaN where it is 0)."""
    target_ns = target_ns.long().reshape(-1)
    signed_ms, percent = values.over(
        [values.TIMESTAMP_ERROR_MS, values.TIMESTAMP_PERCENT], window_ns,
        error_timestamp_ns=(preds_ns.long().reshape(-1) - target_ns).double(),
        true_timestamp_ns=torch.remainder(target_ns, window_ns).double())  # the error's wrap computed once
    return signed_ms, percent


# ----------------------------------------------------------------------------------- functional twins
def iqmpe(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Interquartile mean of the percent errors ``|pred - gt| / |gt| * 100`` (gt = 0 left out)."""
    return iqm(finite(percent_error(preds, target)))


def direction_error(preds: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """P50 and P95 of the direction error in degrees."""
    p50, p95 = quantile(finite(direction_error_deg(preds, target)), [0.5, 0.95])
    return {"p50_deg": p50, "p95_deg": p95}


def timestamp_error(preds_ns: torch.Tensor, target_ns: torch.Tensor, window_ns: int, num_resamples: int = 1000,
                    seed: int = 42) -> dict[str, torch.Tensor]:
    """Wrap-aware timestamp errors in ms: |error| P95, signed IQM with its bootstrap CI, and the IQMPE."""
    signed_ms, percent = timestamp_errors(preds_ns, target_ns, window_ns)
    signed = distinct(signed_ms)  # one sort for the quantile, the IQM and the CI
    low, high = bootstrap_iqm_ci_of_counts(*signed, num_resamples, seed)
    return {"abs_error_p95_ms": quantile_of_counts(*abs_of_counts(*signed), 0.95),
            "signed_error_iqm_ms": iqm_of_counts(*signed), "signed_error_ci_low_ms": low,
            "signed_error_ci_high_ms": high, "iqmpe_pct": iqm(finite(percent))}


def digit_precision_sums(pred_digits: torch.Tensor, target_digits: torch.Tensor) -> torch.Tensor:
    """[k + 1]: samples matching through each digit level (the declared levels, `declare.digit_prefix`: digits
    1..j of every component match), then the number of samples. Digits [N, k], or [N, k, m] for a joint field."""
    p, t = (d.reshape(d.shape[0], d.shape[1], -1) for d in (pred_digits, target_digits))
    fields = [f"component{c}" for c in range(p.shape[2])]
    leaves = {f"error_{name}_digit_{j}": (p[:, j, c] - t[:, j, c]).double()
              for c, name in enumerate(fields) for j in range(p.shape[1])}
    levels = {f"p{j + 1}": digit_prefix(fields[0], j, *fields[1:]) for j in range(p.shape[1])}
    return values.sums({**levels, "events": ONE}, **leaves)


def digit_precision_accuracy(pred_digits: torch.Tensor, target_digits: torch.Tensor) -> torch.Tensor:
    """[k]: p_j = fraction of samples whose digits 1..j all match (so p1 >= p2 >= ...); NaN when empty."""
    sums = digit_precision_sums(pred_digits, target_digits)
    return ratio(sums[:-1], sums[-1])


def keyboard_sums(pred_vk, pred_action, target_vk, target_action, seq_idx: Optional[torch.Tensor] = None,
                  num_sequences: int = 0) -> torch.Tensor:
    """[4 + SUM_PARTS + 1]: the keyboard state's values summed (vk right, action right, both right, events), then
    the sum over sequences of their accuracy (`exact_parts`) and the sequences (0 without ``seq_idx``)."""
    leaves = {**values.pair_leaves(pred_vk.double(), target_vk.double(), "vk"),
              **values.pair_leaves(pred_action.double(), target_action.double(), "action")}
    sums = values.sums(values.KEYBOARD, **leaves)
    seq = torch.zeros(SUM_PARTS + 1, dtype=torch.float64, device=sums.device)
    if seq_idx is not None:
        per_seq = torch.zeros((num_sequences, 2), dtype=torch.float64, device=sums.device).index_add_(
            0, seq_idx, torch.stack([torch.ones_like(leaves["true_vk"]), values.of(values.KEYBOARD_BOTH, **leaves)], 1))
        n, hits = per_seq.unbind(1)
        seq = torch.cat([exact_parts(hits / n.clamp(min=1)).sum(0), (n > 0).sum().double().reshape(1)])
    return torch.cat([sums, seq])


def keyboard_report(sums: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per event: ``accuracy`` (vk and action right), ``vk_accuracy``, ``action_accuracy``; per sequence:
    ``accuracy_seq_macro`` (the mean over sequences of each one's accuracy)."""
    return {"accuracy": ratio(sums[2], sums[3]), "vk_accuracy": ratio(sums[0], sums[3]),
            "action_accuracy": ratio(sums[1], sums[3]),
            "accuracy_seq_macro": ratio(exact_total(sums[4:4 + SUM_PARTS]), sums[4 + SUM_PARTS])}


def keyboard_accuracy(pred_vk, pred_action, target_vk, target_action) -> dict[str, torch.Tensor]:
    return keyboard_report(keyboard_sums(pred_vk, pred_action, target_vk, target_action))


def mouse_action_sums(pred_flags, pred_data, target_flags, target_data) -> torch.Tensor:
    """[4]: the button state's values summed: flags right and events with true flags != 0; scroll right and events
    with true button_data != 0."""
    return values.sums(values.MOUSE_ACTION, **values.pair_leaves(pred_flags.double(), target_flags.double(),
                                                                 "button_flags"),
                       **values.pair_leaves(pred_data.double(), target_data.double(), "button_data"))


def mouse_action_report(sums: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"action_accuracy": ratio(sums[0], sums[1]), "scroll_accuracy": ratio(sums[2], sums[3])}


def mouse_action_accuracy(pred_flags, pred_data, target_flags, target_data) -> dict[str, torch.Tensor]:
    """Button-flag accuracy over events whose true flags != 0; scroll accuracy over true button_data != 0."""
    return mouse_action_report(mouse_action_sums(pred_flags, pred_data, target_flags, target_data))


def movement_sums(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[6]: the movement state's values summed: sum ||p - g||², sum gx, sum gy, sum gx², sum gy², events."""
    return values.sums(values.MOVEMENT, **_vector_leaves(preds, target))


def movement_r2_report(sums: torch.Tensor) -> torch.Tensor:
    """``1 - sum ||p - g||² / sum ||g - mean(g)||²`` from `movement_sums`."""
    residual, gx, gy, gx2, gy2, n = sums
    total = gx2 - gx ** 2 / n.clamp(min=1) + gy2 - gy ** 2 / n.clamp(min=1)
    return ratio(total - residual, total)


def movement_r2(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """R² of movement vectors [N, 2]."""
    return movement_r2_report(movement_sums(preds, target))


def macro_f1(confusion: torch.Tensor) -> torch.Tensor:
    """Macro F1 over the target classes of a confusion matrix [C, C + extra] (rows: target, columns:
    predicted; extra columns such as "invalid" count as misses). Classes neither present nor predicted are
    left out; F1_c = 2 TP / (2 TP + FP + FN)."""
    confusion = confusion.double()
    c = confusion.shape[0]
    tp = confusion.diagonal()
    fn = confusion.sum(dim=1) - tp
    fp = confusion[:, :c].sum(dim=0) - tp
    seen = (tp + fn + fp) > 0
    if not bool(seen.any()):
        return torch.tensor(float("nan"), dtype=torch.float64, device=confusion.device)
    return (2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])).mean()


DETECTION_MICRO = (int(Category.KEYBOARD), int(Category.MOUSE_OP), int(Category.MOUSE_NOP))


def detection_report(counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-category and micro precision / recall / F1 from TP, FP, FN counts [3, N_CAT + 1] (the last column:
    invalid generated events, FP of no category). P = TP / (TP + FP), R = TP / (TP + FN), F1 = 2PR / (P + R),
    each 0 when its denominator is 0; a category with no target and no generated event is left out. The micro
    scores sum keyboard, mouse_op, mouse_nop and the invalid events: ``detect/precision|recall|f1``."""
    counts = counts.double()
    micro = counts[:, list(DETECTION_MICRO)].sum(1) + torch.stack([counts.new_zeros(()), counts[1, N_CAT],
                                                                   counts.new_zeros(())])
    out = {}
    for name, (tp, fp, fn) in [*((f"{c}/", counts[:, i]) for i, c in enumerate(CATEGORY_NAMES)), ("", micro)]:
        if float(tp + fp + fn) == 0:
            continue
        p, r = _or_zero(tp, tp + fp), _or_zero(tp, tp + fn)
        out.update({f"detect/{name}precision": p, f"detect/{name}recall": r, f"detect/{name}f1": _or_zero(2 * p * r, p + r)})
    return out


def _or_zero(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-300), 0.0)


def event_type_report(confusion: torch.Tensor, statuses: torch.Tensor, counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Comparable rates, category ratios, macro F1, count accuracy and counts from `event_type_sums`.

    Over target events that decode (invalid targets are counted apart): ``comparable_rate`` per event and
    ``comparable_rate_seq_macro`` per sequence; comparable = both decode and have the same kind (so the two
    mouse categories are comparable with each other).
    """
    counts = dict(zip(EVENT_COUNTS, counts))
    per_cat = confusion.sum(dim=1)
    decoded = confusion[:, :N_CAT]
    mouse = [int(Category.MOUSE_OP), int(Category.MOUSE_NOP)]
    comparable = decoded.diagonal().clone()
    comparable[mouse] = decoded[mouse][:, mouse].sum(dim=1)
    valid_total = per_cat.sum()
    out = {
        "comparable_rate": ratio(comparable.sum(), valid_total),
        "comparable_rate_seq_macro": ratio(exact_total(torch.stack([counts[f"seq_sum_{j}"] for j in range(SUM_PARTS)])),
                                           counts["seq_count"]),
        "count_accuracy": ratio(counts["count_match"], counts["sequences"]),
        "category/macro_f1": macro_f1(confusion),
        "count/target_events": counts["events"], "count/valid_target_events": valid_total,
        "count/pred_events": counts["pred_events"], "count/comparable": comparable.sum(),
        "count/sequences": counts["sequences"], "count/extra_events": counts["extra"],
        "count/missing_events": counts["missing"],
    }
    out.update({f"status/{s.label}": statuses[int(s)] for s in Status})
    for i, cat in enumerate(CATEGORY_NAMES):
        out[f"{cat}/ratio"] = ratio(per_cat[i], valid_total)
        out[f"{cat}/comparable_rate"] = ratio(comparable[i], per_cat[i])
        out[f"{cat}/count"] = per_cat[i]
    return out


def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, NaN where ``den`` is 0."""
    return torch.where(den > 0, num / den.clamp(min=1e-300), math.nan)
