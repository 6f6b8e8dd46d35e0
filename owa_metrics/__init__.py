"""owa-metrics: event-level metrics for desktop agents trained on OWA event tokens.

The stack, each layer importing only those below it: ``schema`` (the codes and the `Event` every stage shares)
<- ``tokens`` (the formats and the tokenizer map) <- ``events`` (real recordings, the simulator) <- ``decode``
(token ids to a batch of events, vectorized) <- ``functional`` (the metrics' functional twins) <- ``metrics``
(torchmetrics) <- ``report``, ``figures`` (tables and figures of a report) <- the two doors: ``callbacks`` (the
training loop: Lightning, HF Trainer) and ``offline`` (files: token files, MCAPs, D2E folders, sharded over ranks;
the HTML page) <- ``demo``, ``cli``. ``owa_metrics.evaluate`` re-exports `evaluate` and `write_sequences`.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("owa-metrics")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

# name -> subpackage; imported on first use, so that `owa-metrics --help` starts without torch
_EXPORTS = {
    **dict.fromkeys(["EventBatch", "EventFields", "align_teacher_forcing", "decode_batch", "reference_decode"],
                    "decode"),
    **dict.fromkeys(["CATEGORY_NAMES", "Category", "Event", "Kind", "Status"], "schema"),
    **dict.fromkeys(["IQMPE", "DigitPrecisionAccuracy", "DirectionError", "EuclideanPercentError",
                     "KeyboardAccuracy", "MouseActionAccuracy", "MovementR2", "OWAEventMetrics", "OWAMetricTracker",
                     "SignedPercentError", "TimestampError", "compute_metrics_for_event"], "metrics"),
    **dict.fromkeys(["CodecConfig", "EventCodec", "EventDecodeError", "EventEncodeError", "Role", "VocabMap",
                     "build_tokenizer"], "tokens"),
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
