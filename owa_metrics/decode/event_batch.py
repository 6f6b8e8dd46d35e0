"""What the decoder gives: one row per target event of a batch, both sides' fields, and what time pairing found.

`EventBatch` is what every metric reads (`owa_metrics.decode.decode_batch` builds it); this module holds only the
containers, so that the decoder and the time matching both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Optional

import torch

from ..schema import Status

Alignment = Literal["teacher_forcing", "generation"]
Backend = Literal["auto", "torch", "kernel"]
Pairing = Literal["index", "time"]


@dataclass
class TimeMatching:
    """What ``pairing="time"`` found in a batch (target events in the `EventBatch`'s row order).

    ``detection`` / ``paired`` [n_target_events]: index of the matched generated event (in (row, position)
    order over every generated event span), -1 for none; ``paired`` holds the detection matches plus the
    kind matches. ``detection_counts`` [3, N_CAT + 1] (float64): TP, FP, FN per category, the last column the
    invalid generated events (FP of no category). ``detection_error_ms`` [n_target_events]: |a_p - a_t| (ms) of
    each detection match, NaN where none.
    ``extra_events``: valid generated events paired with nothing; ``invalid_pred_events``: generated event
    spans that do not decode. ``target_ns`` [n_target_events] / ``generated_ns`` [every generated event span]:
    the absolute times (`unwrap_ns`; 0 where the event does not decode). ``tolerance_ns``: the tolerance the
    detection and the pairs were matched at (a sweep's first). A tolerance sweep: ``sweep_ns`` its tolerances (ns),
    ``sweep_counts`` [len(sweep_ns), 3, N_CAT + 1] the detection counts at each (the first: ``detection_counts``).
    ``origin_ns`` [num_sequences]: each row's time origin (the absolute times' axis). ``sweep_detection``
    [len(sweep_ns), n_target_events]: a sweep's ``detection`` at each tolerance.
    """

    detection: torch.Tensor
    paired: torch.Tensor
    detection_counts: torch.Tensor
    detection_error_ms: torch.Tensor
    extra_events: torch.Tensor
    invalid_pred_events: torch.Tensor
    target_ns: torch.Tensor
    generated_ns: torch.Tensor
    tolerance_ns: int
    sweep_ns: tuple = ()
    sweep_counts: Optional[torch.Tensor] = None
    origin_ns: Optional[torch.Tensor] = None
    sweep_detection: Optional[torch.Tensor] = None


VALUE_COLUMNS = ("category", "timestamp_ns", "vk", "action", "dx", "dy", "button_flags", "button_data")


@dataclass
class EventFields:
    """Decoded fields of one side (target or prediction), one row per target event.

    ``values`` [N, 8] (int64) holds the `VALUE_COLUMNS` (also readable by name: ``fields.dx``; ``action`` 0
    press, 1 release) and ``digits`` [N, n_ts + 2 n_delta] (int32) the timestamp, dx and dy digits (sign first).
    They are meaningful where ``status == Status.VALID``; elsewhere numbers are 0, digits -1 and the
    category is ``Category.INVALID``. ``kind`` is what the type token said (-1: none), valid or not.
    ``start`` / ``end`` are the token span in the side's own sequence (inclusive; -1: no predicted event);
    ``start_cut`` marks a span whose ``<EVENT_START>`` was cut off (it starts at its type token).
    """

    status: torch.Tensor
    kind: torch.Tensor
    values: torch.Tensor
    digits: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    start_cut: torch.Tensor
    n_timestamp_digits: int

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in VALUE_COLUMNS:
            return self.values[:, VALUE_COLUMNS.index(name)]
        raise AttributeError(name)

    @property
    def timestamp_digits(self) -> torch.Tensor:
        return self.digits[:, :self.n_timestamp_digits]

    @property
    def dx_digits(self) -> torch.Tensor:
        n = (self.digits.shape[1] - self.n_timestamp_digits) // 2
        return self.digits[:, self.n_timestamp_digits:self.n_timestamp_digits + n]

    @property
    def dy_digits(self) -> torch.Tensor:
        n = (self.digits.shape[1] - self.n_timestamp_digits) // 2
        return self.digits[:, self.n_timestamp_digits + n:]

    def take(self, index: torch.Tensor) -> "EventFields":
        return replace(self, **{name: getattr(self, name).index_select(0, index) for name in _ROW_TENSORS})


_ROW_TENSORS = ("status", "kind", "values", "digits", "start", "end", "start_cut")


@dataclass
class EventBatch:
    """One row per target event of a batch: where it is, both sides' fields and how they compare.

    ``status`` is the comparison status: VALID (comparable: both decode, same kind), TYPE_MISMATCH (the predicted
    type token names another kind: under teacher forcing whatever follows it, in generation the prediction
    decodes), the prediction's own decode status (INVALID_FORMAT, MISSING_FIELDS, TRUNCATED, MISSING) or INVALID_TARGET.
    ``target_count`` / ``pred_count`` [num_sequences] count events per sequence (equal under teacher forcing).
    ``time_matching``: what generation by time found (`TimeMatching`), else None. ``generated`` /
    ``generated_seq`` (generation): every generated event span decoded on its own, in (row, position) order, and its row.
    ``keyboard_bound`` (generation, the torch decoder): the most keyboard type tokens in one row of the target and of
    the generated ids, a bound on a row's keyboard events of each side (host ints, read with the numbers of events);
    None when not known. ``event_bound`` (generation by time, the torch decoder): the most events in one row of the
    target and of the generated ids (host ints, read with them): the fixed shapes of the time matching
    (`owa_metrics.decode.matching.Lanes`); None when not known.
    """

    seq_idx: torch.Tensor
    status: torch.Tensor
    target: EventFields
    pred: EventFields
    target_count: torch.Tensor
    pred_count: torch.Tensor
    num_sequences: int
    alignment: Alignment
    time_matching: Optional[TimeMatching] = None  # pairing="time": detection counts, errors, extra events
    generated: Optional[EventFields] = None
    generated_seq: Optional[torch.Tensor] = None
    keyboard_bound: Optional[tuple[int, int]] = None
    event_bound: Optional[tuple[int, int]] = None

    def __len__(self) -> int:
        return int(self.seq_idx.numel())

    @property
    def comparable(self) -> torch.Tensor:
        return self.status == int(Status.VALID)
