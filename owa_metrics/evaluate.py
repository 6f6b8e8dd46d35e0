"""Where users import the offline evaluation from; the code lives in `owa_metrics.offline.evaluate`."""

from .offline.evaluate import evaluate, write_sequences

__all__ = ["evaluate", "write_sequences"]
