"""How a metric of the report is declared: its per-event values, the events it reads, how they reduce.

A `Definition` names its states and says how ``compute`` turns them into keys. A state is one of

- `Sums`: for each of its groups of events (`GROUPS`), the sum of each of its per-event values;
- `SequenceMean`: over the sequences with an event of its group, the sum of each one's mean of a value (in
  `exact_parts`: the same bits whatever the order of the batches, ranks and files), and their number (a
  per-sequence macro average);
- `BatchCounts`: counts per batch of sequences (`BATCH_COUNTS`);
- `Samples`: per-event values of a group kept exactly (``mode="exact"``) or in a sketch, split by the true
  category when asked;
- `Given`: sums that a step beside the event rows gives (the token statistics, the time matching).

A per-event value is a `Value`: an expression over one decoded row (`owa_metrics.decode.EventBatch`) whose
leaves are the row's codes and fields (`one`, `code_is`, `same`, `present`, `true`, `pred`, `error`), with integer
constants where an op takes them (`within`). The plan
(`owa_metrics.functional.plan`) derives from the declarations every table that both the torch path and the
compiled CPU path read: no metric is written twice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from ..schema import CATEGORY_NAMES, Category, Status

# the codes of a row that the groups and `code_is` read: comparison status, target decode status, predicted
# category column (an undecoded type mismatch in its type token's column), predicted kind, true category
CODES = ("status", "target_status", "pred_column", "pred_kind", "target_category")


@dataclass(frozen=True)
class Value:
    """A per-event value: ``op`` over ``args`` (leaves or other values); NaN where it is not defined."""

    op: str
    args: tuple = ()

    def __add__(self, other: "Value") -> "Value":
        return Value("add", (self, other))

    def __sub__(self, other: "Value") -> "Value":
        return Value("sub", (self, other))

    def __mul__(self, other: "Value") -> "Value":
        return Value("mul", (self, other))

    def __abs__(self) -> "Value":
        return Value("abs", (self,))


ONE = Value("one")


def code_is(code: str, value: int) -> Value:
    """1 where the row's code (`CODES`) equals ``value``."""
    return Value("is", (code, int(value)))


def same(*fields: str) -> Value:
    """1 where the prediction equals the truth on every field (`VALUE_COLUMNS`) or digit (``timestamp_digit_0`` ...)."""
    return Value("match", (tuple(f"error_{f}" for f in fields), ()))


def present(field: str) -> Value:
    """1 where the true field is not 0."""
    return Value("match", ((), (f"true_{field}",)))


def same_where_present(field: str) -> Value:
    """1 where the true field is not 0 and the prediction equals it."""
    return Value("match", ((f"error_{field}",), (f"true_{field}",)))


def digit_prefix(field: str, level: int, *more: str) -> Value:
    """1 where digits 0..level of ``field`` (and of each of ``more``) all match (the digit-precision levels)."""
    return same(*(f"{f}_digit_{j}" for f in (field, *more) for j in range(level + 1)))


def true(field: str) -> Value:
    return Value("number", (f"true_{field}",))


def pred(field: str) -> Value:
    return Value("number", (f"pred_{field}",))


def error(field: str) -> Value:
    """prediction - truth."""
    return Value("number", (f"error_{field}",))


def wrapped_ns(value: Value) -> Value:
    """A timestamp difference in ns -> the shortest signed difference in the format's window (``[-W/2, W/2)``)."""
    return Value("wrap", (value,))


def ms(value: Value) -> Value:
    return Value("ms", (value,))


def root_percent(num: Value, den: Value) -> Value:
    """``sqrt(num / den) * 100``, computed as ``sqrt(num / den * 100 * 100)``: a function of the ratio rounded once,
    so equal ratios (of integer sums of squares) give equal values on every path (ties decide which values an IQM
    keeps); NaN where ``den`` is 0."""
    return Value("rootpct", (num, den))


def percent(num: Value, den: Value) -> Value:
    """``num / den * 100``, NaN where ``den`` is 0."""
    return Value("pct", (num, den))


def within(value: Value, low: int, high: int) -> Value:
    """1 where ``low <= value <= high`` (integers), else 0 (a key group: the true vk within a range)."""
    return Value("within", (value, int(low), int(high)))


def direction_deg(px: Value, py: Value, gx: Value, gy: Value) -> Value:
    """Angle between (px, py) and (gx, gy): ``min(|dθ|, 360 - |dθ|)`` degrees by atan2; NaN where g = 0."""
    return Value("direction", (px, py, gx, gy))


def _groups() -> dict[str, Callable]:
    """Named groups of events, each a predicate over the row's codes (numpy arrays, `CODES`)."""
    comparable = lambda c: c["status"] == int(Status.VALID)  # noqa: E731
    valid = lambda c: c["target_status"] == int(Status.VALID)  # noqa: E731
    mouse = (int(Category.MOUSE_OP), int(Category.MOUSE_NOP))
    out = {"all": lambda c: c["status"] >= 0, "valid": valid, "comparable": comparable,
           "comparable_mouse": lambda c: comparable(c) & ((c["target_category"] == mouse[0])
                                                         | (c["target_category"] == mouse[1]))}
    for k, name in enumerate(CATEGORY_NAMES):
        out[f"comparable_{name}"] = lambda c, k=k: comparable(c) & (c["target_category"] == k)
        out[f"valid_{name}"] = lambda c, k=k: valid(c) & (c["target_category"] == k)
    return out


GROUPS = _groups()
# per batch: sequences, sequences whose event counts match, predicted events, surplus generated and target events
BATCH_COUNTS = ("sequences", "count_match", "pred_events", "extra", "missing")


@dataclass(frozen=True)
class Sums:
    """[groups, values]: the sum over each group's events of each value (``when``: only in the updates that give
    that `Given` state)."""

    groups: tuple[str, ...]
    values: dict[str, Value]
    when: Optional[str] = None


@dataclass(frozen=True)
class SequenceMean:
    """[SUM_PARTS + 1]: the sum over the sequences with an event of ``group`` of the mean of ``value`` over them, as
    `exact_parts`; their number."""

    group: str
    value: Value


@dataclass(frozen=True)
class BatchCounts:
    """[len(BATCH_COUNTS)]: `BATCH_COUNTS` summed over batches."""


@dataclass(frozen=True)
class Samples:
    """The ``values`` of each event of ``group``, kept (exact mode: rows of the values, then the true category when
    ``by_category``) or counted in a sketch per value (and per true category, after the whole group)."""

    group: str
    values: dict[str, Value]
    by_category: bool = False


@dataclass(frozen=True)
class Given:
    """Sums of ``shape`` that a step beside the event rows gives: ``fn(batch, extras)`` -> one tensor per entry of
    ``parts``, each added to ``state[part]`` (``extras``: the update's token statistics, ``extras["tokens"]``). With
    groups of sequences (tags: ``extras["group"]``, each sequence's group [B], not None) each tensor has a leading
    axis of ``extras["groups"]``, its sums by group (`per_group`). ``extras["host_reads"]``: True on the compiled CPU
    path, where a read on the host costs nothing (absent on the torch path: the GPU's, no sync wanted)."""

    shape: tuple[int, ...]
    fn: Callable
    parts: tuple = ((),)


@dataclass(frozen=True)
class GivenSamples:
    """Samples that ``fn(batch, extras)`` gives per update, beside the event rows: ``(values, seq)``, one value each
    (NaN: no sample) and the sequence it is of (its group's sample, with groups of sequences)."""

    fn: Callable


SUM_PARTS, PART_SCALE = 3, 2.0 ** 28  # `exact_parts`: 3 integers of 28 bits


@functools.lru_cache(maxsize=None)
def _scales(device) -> torch.Tensor:
    """[SUM_PARTS]: 2^28, 2^56, 2^84 on ``device`` (made once: no copy to a GPU per update)."""
    return PART_SCALE ** torch.arange(1, SUM_PARTS + 1, dtype=torch.float64, device=device)


def exact_parts(x: torch.Tensor) -> torch.Tensor:
    """[..., SUM_PARTS] float64: x = sum_j parts[j] 2^(-28 (j + 1)), each part an integer (|part| <= 2^28 for
    |x| <= 1; the last rounded down, so x is kept exactly on the 2^-84 grid: a mean c / n of 0s and 1s over
    n < 2^31 events is). Parts add as integers, exactly below 2^53 (2^25 terms of |x| <= 1), so a sum of them is
    the same whatever the order of adding (batches, ranks, files); `exact_total` reads it. A float sum is not."""
    floors = torch.floor(x[..., None] * _scales(x.device))  # floor(x 2^(28 (j + 1))): exact
    return floors - torch.nn.functional.pad(floors[..., :-1] * PART_SCALE, (1, 0))  # exact: the parts are integers


def exact_total(parts: torch.Tensor) -> torch.Tensor:
    """The value of summed `exact_parts` [..., SUM_PARTS] (the last part first: one fixed order)."""
    total = torch.zeros_like(parts[..., 0])
    for j in reversed(range(SUM_PARTS)):
        total = (total + parts[..., j]) / PART_SCALE
    return total


def per_group(values: torch.Tensor, seq: torch.Tensor, extras: dict) -> torch.Tensor:
    """The sums of ``values`` [n, ...] (entry k of sequence ``seq[k]``): over all entries [...], or by group of
    sequences [groups, ...] (``extras["group"]``: each sequence's group, in [0, ``extras["groups"]``)), in one op."""
    group = extras.get("group")
    if group is None:
        return values.sum(0)
    return values.new_zeros((extras["groups"], *values.shape[1:])).index_add_(0, group.index_select(0, seq.long()),
                                                                                values)


State = Union[Sums, SequenceMean, BatchCounts, Samples, Given, GivenSamples]


@dataclass(frozen=True)
class Definition:
    """Keys of the report: the ``states`` they read (built for a format's `Shape`) and ``compute(read) -> keys``
    (`owa_metrics.metrics.shared_compute.Read`). ``alignment`` / ``pairing``: the only ones it applies to (None: all)."""

    name: str
    states: Callable[["Shape"], dict[str, State]]
    compute: Callable
    alignment: Optional[str] = None
    pairing: Optional[str] = None

    def applies(self, alignment: str, pairing: str) -> bool:
        return self.alignment in (None, alignment) and self.pairing in (None, pairing)


@dataclass(frozen=True)
class Shape:
    """What a format gives the declarations: the digits per field, the timestamp window; and the metric's tolerance
    sweep (ms; empty: one tolerance) and D2E protocol (bin width in ms, None: off; shifts; empty bins)."""

    n_timestamp_digits: int
    n_delta_digits: int
    window_ns: int
    tolerances_ms: tuple = ()
    bin_ms: Optional[float] = None
    bin_shifts: tuple = ()
    empty_bins_as_correct: bool = False
