"""Continuous-error metrics: distributions of per-event errors, summarized by quantiles, IQM and bootstrap CIs."""

from __future__ import annotations

from typing import Optional

import torch

from ..functional.events import (
    direction_error_deg, euclidean_percent_error, movement_r2_report, movement_sums, percent_error,
    signed_percent_error, timestamp_errors,
)
from ..tokens.codec import CodecConfig
from .base import Float64Metric, SampleMetric, check_same_shape, check_vectors

class IQMPE(SampleMetric):
    """Interquartile mean percent error: ``IQM(|pred - gt| / |gt| * 100)`` over samples with gt != 0 (in %).

    ``update(preds, target)`` with numeric tensors of the same shape.
    """

    higher_is_better = False
    plot_lower_bound = 0.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sample_state("abs_percent_errors")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        check_same_shape(self, preds=preds, target=target)
        self._push("abs_percent_errors", percent_error(preds, target))

    def compute(self) -> torch.Tensor:
        return self._distribution("abs_percent_errors").iqm()

class DirectionError(SampleMetric):
    """Angle between predicted and true (dx, dy), ``min(|dθ|, 360 - |dθ|)`` degrees via atan2; true zero
    vectors left out. ``compute()`` -> ``{"p50_deg", "p95_deg"}``."""

    higher_is_better = False
    plot_lower_bound, plot_upper_bound = 0.0, 180.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sample_state("direction_errors_deg")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """``preds``, ``target``: [N, 2] movement vectors (dx, dy)."""
        check_vectors(self, preds, target)
        self._push("direction_errors_deg", direction_error_deg(preds, target))

    def compute(self) -> dict[str, torch.Tensor]:
        p50, p95 = self._distribution("direction_errors_deg").quantile([0.5, 0.95])
        return {"p50_deg": p50, "p95_deg": p95}

class TimestampError(SampleMetric):
    """Timestamp errors, wrap-aware in the token format's window (15.99 s vs 0.01 s is +20 ms):

    - ``abs_error_p95_ms``: P95 of |pred - gt|;
    - ``signed_error_iqm_ms`` and its bootstrap CI (``_ci_low_ms``, ``_ci_high_ms``): IQM of pred - gt;
    - ``iqmpe_pct``: IQM of |pred - gt| / |gt| * 100 (gt = the true timestamp within the window, 0 left out).

    ``update(preds_ns, target_ns)`` with integer nanosecond tensors. The window: ``window_ns``, else the
    ``format``'s (hierarchical 16 s, factorized 10 s).
    """

    higher_is_better = False

    def __init__(self, window_ns: Optional[int] = None, format: str = "hierarchical", **kwargs):
        super().__init__(**kwargs)
        self.window_ns = window_ns or CodecConfig.preset(format).timestamp_window_ns
        self._add_sample_state("timestamp_signed_errors_ms")
        self._add_sample_state("timestamp_percent_errors")

    def sync_settings(self) -> dict:
        return {**super().sync_settings(), "window_ns": self.window_ns}

    def update(self, preds_ns: torch.Tensor, target_ns: torch.Tensor) -> None:
        check_same_shape(self, preds_ns=preds_ns, target_ns=target_ns)
        signed_ms, percent = timestamp_errors(preds_ns, target_ns, self.window_ns)
        self._push("timestamp_signed_errors_ms", signed_ms)
        self._push("timestamp_percent_errors", percent)

    def compute(self) -> dict[str, torch.Tensor]:
        signed = self._distribution("timestamp_signed_errors_ms")
        low, high = signed.iqm_ci(self.num_resamples, self.seed)
        return {"abs_error_p95_ms": signed.abs().quantile(0.95), "signed_error_iqm_ms": signed.iqm(),
                "signed_error_ci_low_ms": low, "signed_error_ci_high_ms": high,
                "iqmpe_pct": self._distribution("timestamp_percent_errors").iqm()}

class SignedPercentError(SampleMetric):
    """IQM of the signed percent error ``(pred - gt) / gt * 100`` (gt != 0) with its bootstrap CI:
    ``{"iqm_pct", "ci_low_pct", "ci_high_pct"}`` (positive: overshoot)."""

    higher_is_better = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sample_state("signed_percent_errors")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        check_same_shape(self, preds=preds, target=target)
        self._push("signed_percent_errors", signed_percent_error(preds, target))

    def compute(self) -> dict[str, torch.Tensor]:
        dist = self._distribution("signed_percent_errors")
        low, high = dist.iqm_ci(self.num_resamples, self.seed)
        return {"iqm_pct": dist.iqm(), "ci_low_pct": low, "ci_high_pct": high}

class EuclideanPercentError(SampleMetric):
    """``||p - g|| / ||g|| * 100`` of movement vectors (g != 0): ``{"p95_pct", "iqmpe_pct"}``."""

    higher_is_better = False
    plot_lower_bound = 0.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_sample_state("euclidean_percent_errors")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """``preds``, ``target``: [N, 2] movement vectors (dx, dy)."""
        check_vectors(self, preds, target)
        self._push("euclidean_percent_errors", euclidean_percent_error(preds, target))

    def compute(self) -> dict[str, torch.Tensor]:
        dist = self._distribution("euclidean_percent_errors")
        return {"p95_pct": dist.quantile(0.95), "iqmpe_pct": dist.iqm()}

class MovementR2(Float64Metric):
    """R² of movement vectors: ``1 - sum ||p - g||² / sum ||g - mean(g)||²`` from running sums."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    plot_upper_bound = 1.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("movement_sums", default=torch.zeros(6, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """``preds``, ``target``: [N, 2] movement vectors (dx, dy)."""
        check_vectors(self, preds, target)
        self.movement_sums += movement_sums(preds, target)

    def compute(self) -> torch.Tensor:
        return movement_r2_report(self.movement_sums)

    def plot(self, val=None, ax=None):
        return self._plot(val, ax)