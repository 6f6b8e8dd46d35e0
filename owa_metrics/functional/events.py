"""Per-sample event errors and the functional twins of the metric classes (plain tensors in, tensors out).

Every function is vectorized; a metric with no samples returns NaN.
"""

from __future__ import annotations

import math

import torch

from .stats import bootstrap_iqm_ci, iqm, quantile


def percent_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``|pred - gt| / |gt| * 100`` for the samples with ``gt != 0`` (the others are left out)."""
    preds, target = preds.double().reshape(-1), target.double().reshape(-1)
    keep = target != 0
    return (preds[keep] - target[keep]).abs() / target[keep].abs() * 100


def signed_percent_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``(pred - gt) / gt * 100`` for the samples with ``gt != 0``."""
    preds, target = preds.double().reshape(-1), target.double().reshape(-1)
    keep = target != 0
    return (preds[keep] - target[keep]) / target[keep] * 100


def euclidean_percent_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``||p - g|| / ||g|| * 100`` of vectors [N, 2] with ``g != 0``."""
    preds, target = preds.double().reshape(-1, 2), target.double().reshape(-1, 2)
    norm = target.norm(dim=1)
    keep = norm != 0
    return (preds[keep] - target[keep]).norm(dim=1) / norm[keep] * 100


def direction_error_deg(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Angle between vectors [N, 2] (dx, dy): ``min(|dθ|, 360 - |dθ|)`` with atan2, true zero vectors left out."""
    preds, target = preds.double().reshape(-1, 2), target.double().reshape(-1, 2)
    keep = (target != 0).any(dim=1)
    p, t = preds[keep], target[keep]
    delta = (torch.atan2(p[:, 1], p[:, 0]) - torch.atan2(t[:, 1], t[:, 0])).abs()
    return torch.minimum(delta, 2 * math.pi - delta) * (180 / math.pi)


def wrapped_difference(preds: torch.Tensor, target: torch.Tensor, window: int) -> torch.Tensor:
    """Shortest signed difference ``pred - gt`` modulo ``window`` (in ``[-window/2, window/2)``)."""
    half = window // 2
    return torch.remainder(preds.long() - target.long() + half, window) - half


def iqmpe(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Interquartile mean of the percent errors ``|pred - gt| / |gt| * 100`` (gt = 0 left out)."""
    return iqm(percent_error(preds, target))


def digit_matches(pred_digits: torch.Tensor, target_digits: torch.Tensor) -> torch.Tensor:
    """[N, k] bool: digits 1..j all match (for [N, k, m]: every component matches through digit j)."""
    equal = pred_digits == target_digits
    if equal.dim() == 3:
        equal = equal.all(dim=2)
    return equal.long().cumprod(dim=1).bool()


def digit_precision_accuracy(pred_digits: torch.Tensor, target_digits: torch.Tensor) -> torch.Tensor:
    """[k]: p_j = fraction of samples whose digits 1..j all match (so p1 >= p2 >= ...); NaN when empty."""
    matches = digit_matches(pred_digits, target_digits)
    if matches.shape[0] == 0:
        return torch.full((matches.shape[1],), float("nan"), dtype=torch.float64, device=matches.device)
    return matches.double().mean(dim=0)


def direction_error(preds: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """P50 and P95 of the direction error in degrees."""
    p50, p95 = quantile(direction_error_deg(preds, target), [0.5, 0.95])
    return {"p50_deg": p50, "p95_deg": p95}


def keyboard_accuracy(pred_vk, pred_action, target_vk, target_action) -> dict[str, torch.Tensor]:
    """Fractions of keyboard events with the right vk, the right press/release, and both (``accuracy``)."""
    vk, action = pred_vk == target_vk, pred_action == target_action
    mean = lambda x: x.double().mean() if x.numel() else torch.tensor(float("nan"), dtype=torch.float64)  # noqa: E731
    return {"accuracy": mean(vk & action), "vk_accuracy": mean(vk), "action_accuracy": mean(action)}


def mouse_action_accuracy(pred_flags, pred_data, target_flags, target_data) -> dict[str, torch.Tensor]:
    """Button-flag accuracy over events whose true flags != 0; scroll accuracy over true button_data != 0."""
    acts, scrolls = target_flags != 0, target_data != 0
    mean = lambda x: x.double().mean() if x.numel() else torch.tensor(float("nan"), dtype=torch.float64)  # noqa: E731
    return {"action_accuracy": mean(pred_flags[acts] == target_flags[acts]),
            "scroll_accuracy": mean(pred_data[scrolls] == target_data[scrolls])}


def timestamp_error(preds_ns: torch.Tensor, target_ns: torch.Tensor, window_ns: int, num_resamples: int = 1000,
                    seed: int = 42) -> dict[str, torch.Tensor]:
    """Wrap-aware timestamp errors in ms: |error| P95, signed IQM with its bootstrap CI, and the IQMPE."""
    signed_ms = wrapped_difference(preds_ns, target_ns, window_ns).double() / 1e6
    low, high = bootstrap_iqm_ci(signed_ms, num_resamples, seed)
    return {"abs_error_p95_ms": quantile(signed_ms.abs(), 0.95), "signed_error_iqm_ms": iqm(signed_ms),
            "signed_error_ci_low_ms": low, "signed_error_ci_high_ms": high,
            "iqmpe_pct": iqm(timestamp_percent_error(signed_ms, target_ns))}


def timestamp_percent_error(signed_ms: torch.Tensor, target_ns: torch.Tensor) -> torch.Tensor:
    """``|wrapped error| / |gt timestamp in the window| * 100``, gt = 0 left out."""
    target_ms = target_ns.double() / 1e6
    keep = target_ms != 0
    return signed_ms[keep].abs() / target_ms[keep].abs() * 100


def movement_r2(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """R² of movement vectors [N, 2]: ``1 - sum ||p - g||² / sum ||g - mean(g)||²``."""
    preds, target = preds.double().reshape(-1, 2), target.double().reshape(-1, 2)
    residual = ((preds - target) ** 2).sum()
    total = ((target - target.mean(dim=0)) ** 2).sum()
    return 1 - residual / total if target.shape[0] else torch.tensor(float("nan"), dtype=torch.float64)


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
