"""Functional twins of the metrics: plain tensors in, results out (stats, per-event errors, token stats)."""

from .events import (
    detection_report, digit_precision_accuracy, direction_error, direction_error_deg, euclidean_percent_error, iqmpe,
    keyboard_accuracy, macro_f1, mouse_action_accuracy, movement_r2, percent_error, signed_percent_error, timestamp_error,
    wrapped_difference,
)
from .stats import SketchSpec, bootstrap_iqm_ci, iqm, quantile

__all__ = [
    "SketchSpec", "bootstrap_iqm_ci", "detection_report", "digit_precision_accuracy", "direction_error",
    "direction_error_deg",
    "euclidean_percent_error", "iqm", "iqmpe", "keyboard_accuracy", "macro_f1", "mouse_action_accuracy",
    "movement_r2", "percent_error", "quantile", "signed_percent_error", "timestamp_error", "wrapped_difference",
]
