"""Metrics: torchmetrics classes over decoded events, and the `OWAEventMetrics` collection."""

from .accuracy import DigitPrecisionAccuracy, KeyboardAccuracy, MouseActionAccuracy
from .base import Distribution, SampleMetric
from .collection import OWAEventMetrics
from .errors import IQMPE, DirectionError, EuclideanPercentError, MovementR2, SignedPercentError, TimestampError
from .events import EventTokenMetrics, EventTypeMetrics
from .per_event import compute_metrics_for_event
from .tracker import OWAMetricTracker

__all__ = [
    "IQMPE", "DigitPrecisionAccuracy", "DirectionError", "Distribution", "EuclideanPercentError", "EventTokenMetrics",
    "EventTypeMetrics", "KeyboardAccuracy", "MouseActionAccuracy", "MovementR2", "OWAEventMetrics", "OWAMetricTracker", "SampleMetric",
    "SignedPercentError", "TimestampError", "compute_metrics_for_event",
]
