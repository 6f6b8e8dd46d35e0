"""What the model did, drawn: a sequence's true and predicted events on one time axis (`timeline`), the D2E
latency curve (`latency`), the category confusion (`confusion`). Matplotlib figures made without pyplot; every
drawn element of a timeline or a latency curve carries a ``gid`` naming what it shows, so that a test reads the
figure back."""

from .confusion import confusion_figure, png_of
from .latency import draw_latency_curve, latency_curve, shift_of
from .timeline import (Bins, Timeline, Track, batch_timelines, draw_timeline, recording_timeline, sequence_errors,
                       timeline_counts)

__all__ = ["Bins", "Timeline", "Track", "batch_timelines", "confusion_figure", "draw_latency_curve", "draw_timeline",
           "latency_curve", "png_of", "recording_timeline", "sequence_errors", "shift_of", "timeline_counts"]
