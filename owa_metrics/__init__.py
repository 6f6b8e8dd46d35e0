"""owa-metrics: event-level metrics for desktop agents trained on OWA event tokens.

The flow, one folder a stage: ``tokens`` (the format and the tokenizer map) -> ``decode`` (token ids to a
batch of events, vectorized) -> ``events`` (the event model, real recordings) -> ``metrics`` (torchmetrics,
over ``functional`` twins) -> ``callbacks``.
"""

from importlib.metadata import PackageNotFoundError, version

from .decode import EventBatch, EventFields, align_teacher_forcing, decode_batch, reference_decode
from .events import CATEGORY_NAMES, Category, Event, Kind, Status
from .metrics import (
    IQMPE, DigitPrecisionAccuracy, DirectionError, EuclideanPercentError, KeyboardAccuracy, MouseActionAccuracy,
    MovementR2, OWAEventMetrics, SignedPercentError, TimestampError, compute_metrics_for_event,
)
from .tokens import CodecConfig, EventCodec, EventDecodeError, EventEncodeError, Role, VocabMap, build_tokenizer

try:
    __version__ = version("owa-metrics")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "IQMPE", "DigitPrecisionAccuracy", "DirectionError", "EuclideanPercentError", "KeyboardAccuracy",
    "MouseActionAccuracy", "MovementR2", "OWAEventMetrics", "SignedPercentError", "TimestampError",
    "compute_metrics_for_event", "CATEGORY_NAMES", "Category", "CodecConfig", "Event", "EventBatch", "EventCodec",
    "EventDecodeError", "EventEncodeError",
    "EventFields", "Kind", "Role", "Status", "VocabMap", "align_teacher_forcing", "build_tokenizer",
    "decode_batch", "reference_decode", "__version__",
]
