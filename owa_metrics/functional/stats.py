"""Robust statistics on 1-D samples, exact or from a mergeable log-bucketed sketch.

Both modes read a sample as its ascending distinct values with their counts: exact mode from one sort of the
samples (`distinct`), sketch mode from its non-empty buckets. Quantiles, IQM, CI and histograms read that pair.

Exact (float64, equal to numpy on the same values):

- quantile: linear interpolation between order statistics (``numpy.percentile`` default), any n: the order
  statistic of rank r is the value whose cumulative count first exceeds r (``torch.quantile`` refuses more
  than 2^24 values; this has no limit).
- IQM: ``mean({x : Q25 <= x <= Q75})`` (inclusive), not the mean of the two quartiles. Two distinct
  values leave that set empty: NaN, as numpy.
- bootstrap CI of the IQM: resampling n values with replacement is drawing counts over the K distinct values
  ``~ Multinomial(n, c / n)``; the IQM of each of the B resamples is read from its counts, and CI = the
  (1 - confidence) / 2 and (1 + confidence) / 2 percentiles of the B IQMs. With ``w = ceil(tail_margin sqrt(n))``,
  ``r25 = floor(0.25 (n - 1))``, ``r75 = ceil(0.75 (n - 1))``, the values all of whose ranks are below
  ``r25 - w`` form the left tail, those all above ``r75 + w`` the right tail, the others are kept. The draws,
  with ``rng = numpy.random.default_rng(seed)``: (1) ``rng.multinomial(n, [left, kept, right] / n, size=B)``
  (the samples in each group; empty tails left out); (2) each resample's kept counts given their total T, in
  order: ``rng.multinomial(T, kept / kept total)`` when there are at most max(256, kept samples / 8) kept
  values, else the counts of T draws in [0, kept total) read as kept samples in value order, the draws of
  resample i a counter-based SplitMix64 stream keyed by (seed, i) (`resample.draws`, its formula there);
  (3) a resample whose left count exceeds r25 or whose right count reaches n - r75 (a quartile would read a
  tail value: about 1e-15 of them at tail_margin 4) has both tails split over their values by
  ``numpy.random.default_rng([seed, 1]).multinomial`` (left, then right). Every step is a conditional
  multinomial, so each resample is one of resampling with replacement; without a split its IQM reads kept
  values only. The result is a function of the values and the seed: the same on any device and number of
  ranks. Cost after the sort: O(B x min(kept values, kept samples)), the kept values being those within w ranks
  of the IQR; compiled (`resample`): value by value, numba's own ``Generator.binomial`` makes the multinomial
  (numpy's numbers) and one pass reads each resample's quartiles and weighted counts (`_covered_rows`); sample
  by sample, one loop makes the draws and reads 4 resamples' counts per pass (`resample.sample_by_sample`).

Sketch (DDSketch-style, signed): a value x lands in bucket ``ceil(log_gamma |x|)`` on its sign's side,
``gamma = (1 + alpha) / (1 - alpha)``, and is read back as ``2 gamma^i / (gamma + 1)``: every order
statistic is within relative error alpha. Buckets are laid out in value order (negatives, zero, positives)
so that quantiles are cumulative counts. |x| below ``min_value`` counts as 0; above ``max_value`` it is
clamped to the top bucket.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..decode.kernel import _jit, available as kernel_available
from .resample import CHUNK_ELEMENTS, _covered_rows, draws, multinomial_rows, resample_keys, sample_by_sample

TAIL_MARGIN = 4.0  # kept ranks reach TAIL_MARGIN sqrt(n) past the quartile ranks (about 9 standard deviations)
BY_VALUE = 256, 8  # kept counts drawn value by value when at most max(256, kept samples / 8) kept values


def _lerp(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """numpy's interpolation: ``a + (b - a) t``, computed from b's side when t >= 0.5."""
    diff = b - a
    return torch.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def _nan(shape, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.float64, device=device)


def distinct(x: torch.Tensor, drop_nan: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, counts)``: the ascending distinct values of ``x`` and how often each occurs (float64, NaNs
    last, each its own value; left out with ``drop_nan``). One sort (numpy's on the CPU: its SIMD sort is ~10x
    torch's): O(n log n); everything after it is O(distinct)."""
    x = x.reshape(-1).double()
    if x.device.type == "cpu":
        ascending = np.sort(x.detach().numpy())  # NaNs last, as torch
        ascending = torch.from_numpy(ascending[:np.searchsorted(ascending, np.nan)] if drop_nan else ascending)
    else:
        ascending = (x[~torch.isnan(x)] if drop_nan else x).sort().values
    values, counts = torch.unique_consecutive(ascending, return_counts=True)
    return values, counts.double()


def distinct_by_group(x: torch.Tensor, group: torch.Tensor, groups: int) -> list[tuple[list, tuple]]:
    """Per column of ``x`` [n, m] (``group`` [n]: each row's group, an integer in [0, groups)): ``([distinct(column[group
    == g], drop_nan=True) for g in range(groups)], distinct(column, drop_nan=True))``. On the CPU with the compiled
    kernels: one pass puts each group's rows together in their order (`_group_together`), each group of a column is
    counted in a hash table by its values' bits when it has at most `HASHED_DISTINCT` distinct ones (then those are
    sorted: O(n + distinct log distinct)), else sorted where it lies, and a column's pooled distinct values are
    merged from its groups' (O(distinct log distinct)), not sorted again: they equal one sort of the whole column
    whenever equal values are equal bit for bit (NaNs left out); where not (0.0 and -0.0 both in the column: its
    groups are sorted), and where a row's group is not one of them, the pooled values are one sort, as `distinct`."""
    group = group.reshape(-1)
    columns = [x[:, j] for j in range(x.shape[1])]
    by_sorts = lambda: [([distinct(c[group == g], drop_nan=True) for g in range(groups)],  # noqa: E731
                         distinct(c, drop_nan=True)) for c in columns]
    if x.device.type != "cpu" or not kernel_available():
        return by_sorts()
    together, starts = np.empty((x.shape[1], x.shape[0])), np.empty(groups + 1, dtype=np.int64)
    zeros = np.zeros(x.shape[1], dtype=np.int64)
    if not _group_together(x.detach().double().numpy(), group.detach().double().numpy(), together, starts, zeros):
        return by_sorts()
    out, keys, tally, table = [], np.empty(HASHED_DISTINCT), np.empty(HASHED_DISTINCT, np.int64), np.empty(
        2 * HASHED_DISTINCT, np.int64)
    for j, column in enumerate(columns):
        by_group = []
        for g in range(groups):
            part = together[j, starts[g]:starts[g + 1]]
            k = _hash_distinct(part, keys, tally, table) if zeros[j] != 3 else -1
            if k >= 0:  # few distinct values: counted by their bits, then those sorted
                order = np.argsort(keys[:k])
                by_group.append((torch.from_numpy(keys[order]), torch.from_numpy(tally[order].astype(np.float64))))
                continue
            part.sort()  # NaNs last; the same values in the same order as `distinct` sorts
            values, counts = torch.unique_consecutive(torch.from_numpy(part[:np.searchsorted(part, np.nan)]),
                                                      return_counts=True)
            by_group.append((values, counts.double()))
        if zeros[j] == 3:  # 0.0 and -0.0: which one stands for both is the sort's
            out.append((by_group, distinct(column, drop_nan=True)))
            continue
        values, slot = np.unique(np.concatenate([v.numpy() for v, _ in by_group]), return_inverse=True)
        counts = np.bincount(slot, weights=np.concatenate([c.numpy() for _, c in by_group]), minlength=values.size)
        out.append((by_group, (torch.from_numpy(values), torch.from_numpy(counts.astype(np.float64)))))  # none: int64
    return out


HASHED_DISTINCT = 4096  # a group with at most this many distinct values is counted in a hash table (in L1 / L2)


@_jit
def _hash_distinct(x, keys, tally, table):
    """The distinct values of ``x`` (NaNs left out) into ``keys``, each one's count into ``tally``, by their bits in
    an open-addressing ``table`` (twice as many slots as ``keys``): their number, or -1 once there are more than
    ``keys`` holds. Values are one iff their bits are (true but for 0.0 and -0.0: the caller's column has one)."""
    slots = table.size
    shift = np.uint64(64 - int(np.log2(slots)))
    table[:] = -1
    bits = x.view(np.uint64)
    k = 0
    for i in range(x.size):
        if x[i] != x[i]:
            continue
        at = (bits[i] * np.uint64(0x9E3779B97F4A7C15)) >> shift
        while True:
            slot = table[at]
            if slot < 0:
                if k == keys.size:
                    return -1
                table[at], keys[k], tally[k] = k, x[i], 1
                k += 1
                break
            if keys[slot] == x[i]:
                tally[slot] += 1
                break
            at = (at + np.uint64(1)) & np.uint64(slots - 1)
    return k


@_jit
def _group_together(x, group, together, starts, zeros):
    """``together[j]``: the column j of ``x`` [n, m] group by group (``group``: each row's, in [0, starts.size - 1)),
    each group's values in their order, group g from ``starts[g]``; ``zeros[j]``: whether the column has -0.0 (1),
    0.0 (2), both (3). False (and nothing done) where a group is not one of them."""
    groups = starts.size - 1
    starts[:] = 0
    for i in range(group.size):
        g = group[i]
        if not (0 <= g < groups) or g != int(g):
            return False
        starts[int(g) + 1] += 1
    for g in range(groups):
        starts[g + 1] += starts[g]
    fill = starts[:groups].copy()
    for i in range(x.shape[0]):
        g = int(group[i])
        at = fill[g]
        fill[g] = at + 1
        for j in range(x.shape[1]):
            v = x[i, j]
            together[j, at] = v
            if v == 0:
                zeros[j] |= 1 if np.signbit(v) else 2
    return True


def abs_of_counts(values: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct values of ``|x|`` and their counts, from those of x: O(K log K), no pass over the samples."""
    magnitudes, inverse = torch.unique(values.abs(), sorted=True, return_inverse=True)
    return magnitudes, torch.zeros_like(magnitudes).index_add_(0, inverse, counts)


def _quantile_rows(values: torch.Tensor, cum: torch.Tensor, n: int, q: list[float]) -> torch.Tensor:
    """Quantiles ``q`` of each row of cumulative counts ``cum`` [..., K] (n samples each) over the ascending
    ``values`` [K] -> [..., len(q)]: the order statistics of ranks floor(h), floor(h) + 1 (h = q (n - 1),
    0-based; rank r is the value whose cumulative count first exceeds r), interpolated."""
    h = [p * (n - 1) for p in q]
    lo = [math.floor(x) for x in h]
    ranks = torch.tensor(lo + [min(r + 1, n - 1) for r in lo], dtype=cum.dtype, device=cum.device)
    at = values[torch.searchsorted(cum, ranks.expand(*cum.shape[:-1], -1).contiguous(), right=True)]
    t = torch.tensor([x - r for x, r in zip(h, lo)], dtype=torch.float64, device=cum.device)
    return _lerp(at[..., :len(q)], at[..., len(q):], t)


def _iqm_rows(values: torch.Tensor, counts: torch.Tensor, tied: Optional[torch.Tensor] = None,
              spread: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None) -> torch.Tensor:
    """IQM of each row of ``counts`` [..., K] (rows of one size n) over ``values`` [K]: the mean of the values in
    [Q25, Q75], a value counted whole when it is ``tied`` (None: all, numpy's inclusive IQM of exact values),
    else (a sketch bucket spread over a range) for the ranks it holds in [ceil(0.25 (n - 1)), floor(0.75 (n - 1))].
    ``spread`` (sketch resampling units, `_sketch_units`): ``(unit, x, g)``, each column's unit and the profile
    G(u + f) (piecewise linear through the points ``(x, g)``) = the means of the units before u + the sum of the
    first f of unit u's samples over its count: a unit holding the ranks [f m, f' m) of its m samples in the IQR
    adds m (G(u + f') - G(u + f)), the values of its own buckets there, not m (f' - f) times its mean. O(K) per row."""
    cum = counts.cumsum(-1)
    n = int(cum.reshape(-1, cum.shape[-1])[0, -1])
    quartiles = _quantile_rows(values, cum, n, [0.25, 0.75])
    covered = torch.where((values >= quartiles[..., :1]) & (values <= quartiles[..., 1:]), counts, 0.0)
    if tied is None:
        return (covered * values).sum(-1) / covered.sum(-1)
    before = cum - counts
    low, high = before.clamp(min=math.ceil(0.25 * (n - 1))), cum.clamp(max=math.floor(0.75 * (n - 1)) + 1)
    held = (high - low).clamp(min=0)  # the ranks [low, high) in the IQR
    if spread is None:
        held_sum = held * values
    else:
        unit, x, g = spread
        m = counts.clamp(min=1)
        ends = torch.stack([(low - before) / m, (low - before + held) / m]).clamp(0, 1) + torch.from_numpy(unit)
        profile = torch.from_numpy(np.interp(ends.numpy(), x, g))
        held_sum = counts * (profile[1] - profile[0])
    return torch.where(tied, covered * values, held_sum).sum(-1) / torch.where(tied, covered, held).sum(-1)


def quantile_of_counts(values: torch.Tensor, counts: torch.Tensor, q) -> torch.Tensor:
    """Quantile(s) ``q`` in [0, 1] of the sample given as ascending distinct ``values`` and their ``counts``
    (linear interpolation); NaN when empty or when a value is NaN, as numpy. O(K)."""
    q = torch.as_tensor(q, dtype=torch.float64)
    if values.numel() == 0 or bool(torch.isnan(values[-1])):
        return torch.full(q.shape, float("nan"), dtype=torch.float64, device=values.device)
    cum = counts.cumsum(0)
    return _quantile_rows(values, cum, int(cum[-1]), q.reshape(-1).tolist()).reshape(q.shape)


def iqm_of_counts(values: torch.Tensor, counts: torch.Tensor, tied: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Interquartile mean ``mean({x : Q25 <= x <= Q75})`` of the sample ``(values, counts)`` (a sketch's: with
    ``tied``, see `_iqm_rows`); NaN when empty."""
    if values.numel() == 0 or bool(torch.isnan(values[-1])):
        return _nan((), values.device)
    return _iqm_rows(values, counts, tied)


def bootstrap_iqm_ci_of_counts(values: torch.Tensor, counts: torch.Tensor, num_resamples: int = 1000, seed: int = 42,
                               confidence: float = 0.95, tail_margin: float = TAIL_MARGIN) -> torch.Tensor:
    """``[low, high]`` percentile bootstrap CI of the IQM of the sample ``(values, counts)`` (see the module
    docstring); NaN when empty. O(B x min(kept values, kept samples)), kept ~ within w ranks of the IQR."""
    if values.numel() == 0 or bool(torch.isnan(values[-1])):
        return _nan((2,), values.device)
    replicates = _resample_iqms(values.double().cpu(), counts.double().cpu(), num_resamples, seed, tail_margin)
    return _percentile_interval(replicates, confidence).to(values.device)


def quantile(x: torch.Tensor, q) -> torch.Tensor:
    """Quantile(s) ``q`` in [0, 1] of the values of ``x`` (linear interpolation, any size); NaN when empty."""
    return quantile_of_counts(*distinct(x), q)


def iqm(x: torch.Tensor) -> torch.Tensor:
    """Interquartile mean: ``mean({x : Q25 <= x <= Q75})``; NaN when empty."""
    return iqm_of_counts(*distinct(x))


def bootstrap_iqm_ci(x: torch.Tensor, num_resamples: int = 1000, seed: int = 42, confidence: float = 0.95,
                     tail_margin: float = TAIL_MARGIN) -> torch.Tensor:
    """``[low, high]`` bootstrap CI of the IQM of ``x`` (see the module docstring); NaN when empty.
    O(n log n) for the sort, then O(B x min(kept values, kept samples))."""
    return bootstrap_iqm_ci_of_counts(*distinct(x), num_resamples, seed, confidence, tail_margin)


def _percentile_interval(replicates: torch.Tensor, confidence: float) -> torch.Tensor:
    tail = (1 - confidence) / 2
    return quantile_of_counts(replicates.sort().values, torch.ones_like(replicates), [tail, 1 - tail])


def _resample_iqms(values: torch.Tensor, counts: torch.Tensor, num_resamples: int, seed: int, tail_margin: float,
                   tied: Optional[torch.Tensor] = None,
                   profile: Optional[tuple[np.ndarray, np.ndarray]] = None) -> torch.Tensor:
    """The IQMs (`_iqm_rows` with ``tied`` and a sketch's unit ``profile`` (x, g)) of ``num_resamples`` bootstrap
    resamples of ``(values, counts)`` (CPU, ascending, counts > 0), drawn as in the module docstring: O(B x kept
    values) by value, O(B x kept samples) sample by sample, vectorized per chunk of resamples (the bookkeeping in
    numpy) or compiled (`resample`)."""
    c = counts.numpy()
    n, k = int(c.sum()), c.size
    cum = np.cumsum(c)
    width = math.ceil(tail_margin * math.sqrt(n))
    r25, r75 = math.floor(0.25 * (n - 1)), math.ceil(0.75 * (n - 1))
    a = int(np.searchsorted(cum, r25 - width, side="right"))  # c[:a]: the left tail (every rank below r25 - w)
    b = int(np.searchsorted(cum - c, r75 + width, side="right"))  # c[b:]: the right tail (every rank above r75 + w)
    kept, kept_total = c[a:b], int(c[a:b].sum())
    totals = np.array([c[:a].sum(), kept_total, c[b:].sum()])
    present = totals > 0
    rng, split_rng = np.random.default_rng(seed), None
    groups = np.zeros((num_resamples, 3), dtype=np.int64)  # left tail, kept, right tail
    groups[:, present] = rng.multinomial(n, totals[present] / n, size=num_resamples)
    by_value = b - a <= max(BY_VALUE[0], kept_total / BY_VALUE[1]) or kept_total >= 2**32  # draws: 32-bit words
    slot = None if by_value else np.repeat(np.arange(b - a), kept.astype(np.int64))  # sample -> kept value
    keys = None if by_value else resample_keys(seed, num_resamples)

    def kept_counts(first: int, sizes: np.ndarray) -> np.ndarray:  # of the resamples first, first + 1, ...
        if by_value:
            return multinomial_rows(rng, sizes, kept / kept_total, kernel_available())
        return np.stack([np.bincount(slot[draws(keys[first + i], kept_total, m)], minlength=b - a)
                         for i, m in enumerate(sizes.tolist())])

    def split(total: int, part: np.ndarray) -> np.ndarray:  # a tail's counts over its values, given its total
        nonlocal split_rng
        if not part.size:
            return part
        split_rng = split_rng or np.random.default_rng([seed, 1])
        return split_rng.multinomial(total, part / part.sum())

    # a merged tail reads as its value nearest the kept ones: outside [Q25, Q75] while the quartiles are kept values
    group = lambda v: torch.cat([v[a - 1:a] if a else v[:0], v[a:b], v[b:b + 1]])  # noqa: E731
    group_values, group_tied = group(values), None if tied is None else group(tied)
    spread = group_spread = None
    if profile is not None:
        spread = (np.arange(k, dtype=np.float64), *profile)
        group_spread = (group(torch.from_numpy(spread[0])).numpy(), *profile)

    compiled = tied is None and kernel_available()
    if compiled:  # `_iqm_rows`' quartile ranks and weights, for `_covered_rows`
        h = [0.25 * (n - 1), 0.75 * (n - 1)]
        lo = [math.floor(x) for x in h]
        ranks, weights = np.array([lo[0], min(lo[0] + 1, n - 1), lo[1], min(lo[1] + 1, n - 1)]), np.array(h) - lo

    def resample_iqms(chunk: np.ndarray, middle: np.ndarray) -> torch.Tensor:  # chunk's groups, their kept counts
        drawn = np.concatenate([chunk[:, :1][:, :int(a > 0)], middle, chunk[:, 2:][:, :int(b < k)]], axis=1)
        if compiled:  # the weighted counts summed by torch, as `_iqm_rows` sums them
            weighted, covered = np.empty(drawn.shape), np.empty(len(drawn))
            _covered_rows(group_values.numpy(), drawn, ranks, weights, weighted, covered)
            iqms = torch.from_numpy(weighted).sum(-1) / torch.from_numpy(covered)
        else:
            iqms = _iqm_rows(group_values, torch.from_numpy(drawn).double(), group_tied, group_spread)
        for i in np.flatnonzero((chunk[:, 0] > r25) | (chunk[:, 2] >= n - r75)):  # a tail reaches a quartile: rare
            full = np.concatenate([split(int(chunk[i, 0]), c[:a]), middle[i], split(int(chunk[i, 2]), c[b:])])
            iqms[i] = _iqm_rows(values, torch.from_numpy(full).double(), tied, spread)
        return iqms

    if not by_value and tied is None and bool(torch.isfinite(group_values).all()) and kernel_available():
        return sample_by_sample(keys, groups, kept.astype(np.int64), slot, group_values.numpy(), n, int(totals[0]),
                                max(width, math.ceil(TAIL_MARGIN * math.sqrt(n))), resample_iqms)
    rows, out = max(1, CHUNK_ELEMENTS // (b - a + 2)), []
    for first in range(0, num_resamples, rows):  # loop over chunks of resamples, each vectorized
        chunk = groups[first:first + rows]
        out.append(resample_iqms(chunk, kept_counts(first, chunk[:, 1])))
    return torch.cat(out)


# ------------------------------------------------------------------------------------------- sketch
@dataclass(frozen=True)
class SketchSpec:
    """Bucket layout of a signed relative-error sketch (see the module docstring)."""

    relative_accuracy: float = 0.005
    min_value: float = 1e-4
    max_value: float = 1e8

    def __post_init__(self) -> None:
        if not 0 < self.relative_accuracy < 1:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {self.relative_accuracy}")
        if not 0 < self.min_value < self.max_value:
            raise ValueError(f"need 0 < min_value < max_value, got {self.min_value}, {self.max_value}")

    @property
    def log_gamma(self) -> float:
        return math.log((1 + self.relative_accuracy) / (1 - self.relative_accuracy))

    @property
    def _k_min(self) -> int:
        return math.ceil(math.log(self.min_value) / self.log_gamma)

    @property
    def buckets_per_sign(self) -> int:
        return math.ceil(math.log(self.max_value) / self.log_gamma) - self._k_min + 1

    @property
    def size(self) -> int:
        """State length: negative buckets, zero, positive buckets."""
        return 2 * self.buckets_per_sign + 1

    def index(self, x: torch.Tensor) -> torch.Tensor:
        """Bucket of each value, in value order."""
        x = x if x.dtype == torch.float64 else x.double()
        m, magnitude = self.buckets_per_sign, x.abs()
        k = torch.ceil(torch.log(magnitude.clamp(min=self.min_value)) / self.log_gamma) - self._k_min
        k = k.clamp(0, m - 1).long()
        tiny = magnitude < self.min_value
        return torch.where(tiny, m, torch.where(x > 0, m + 1 + k, m - 1 - k))

    @functools.lru_cache(maxsize=8)
    def values(self, device=None) -> torch.Tensor:
        """The value each bucket reads back as (within relative_accuracy of anything in it); cached, read-only."""
        gamma = math.exp(self.log_gamma)
        k = torch.arange(self.buckets_per_sign, dtype=torch.float64, device=device) + self._k_min
        pos = 2 * torch.exp(k * self.log_gamma) / (gamma + 1)
        return torch.cat([-pos.flip(0), torch.zeros(1, dtype=torch.float64, device=device), pos])


def sketch_counts(x: torch.Tensor, spec: SketchSpec, group: Optional[torch.Tensor] = None,
                  groups: int = 1) -> torch.Tensor:
    """Bucket counts [spec.size] (float64) of the values of ``x``, NaN left out; with ``group`` (an index in
    [0, groups) per value) one row per group: [groups, spec.size]."""
    x = x.reshape(-1)
    bucket = spec.index(torch.nan_to_num(x))
    if group is not None:
        bucket = bucket + group.reshape(-1) * spec.size
    counts = torch.zeros(groups * spec.size, dtype=torch.float64, device=x.device).index_add_(
        0, bucket, (~torch.isnan(x)).double())  # no host sync (a CUDA bincount reads the range of its input)
    return counts if group is None else counts.view(groups, spec.size)


def sketch_distinct(counts: torch.Tensor, spec: SketchSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The non-empty buckets ``(values, counts, tied)``, ascending (as `distinct` of exact samples): a bucket
    whose two neighbours are empty is read as tied values (integers below 1 / (4 alpha) in magnitude, multiples
    of 10 below 10 / (4 alpha), exact zeros), the others as values spread over their bucket."""
    occupied = counts > 0
    near = torch.zeros_like(occupied)
    near[1:] |= occupied[:-1]
    near[:-1] |= occupied[1:]
    return spec.values(counts.device)[occupied], counts[occupied], ~near[occupied]


def sketch_quantile(counts: torch.Tensor, spec: SketchSpec, q) -> torch.Tensor:
    """Quantile(s) ``q`` from bucket counts: each order statistic read from its bucket, then interpolated."""
    return quantile_of_counts(*sketch_distinct(counts, spec)[:2], q)


def sketch_iqm(counts: torch.Tensor, spec: SketchSpec) -> torch.Tensor:
    """IQM from bucket counts: a bucket spread over a range counts for the ranks it holds within the IQR, a tied
    one (`sketch_distinct`) whole when its value is in [Q25, Q75], as exact mode; NaN when empty."""
    return iqm_of_counts(*sketch_distinct(counts, spec))


SKETCH_UNITS = 4  # resampling units of a sketch CI near each quartile (twice as many between them)


def sketch_bootstrap_iqm_ci(counts: torch.Tensor, spec: SketchSpec, num_resamples: int = 1000, seed: int = 42,
                            confidence: float = 0.95, tail_margin: float = TAIL_MARGIN,
                            units: int = SKETCH_UNITS) -> torch.Tensor:
    """``[low, high]`` bootstrap CI of the IQM from bucket counts; NaN when empty.

    The exact-mode resampling (module docstring: group totals, far tails merged, the seed's stream) over the
    non-empty buckets, whose kept part is first merged into resampling units (`_sketch_units`: about 4 x
    ``units``, never across a sign, never with the zero bucket or a tied bucket near a quartile), each read back
    as its count-weighted mean; each resample's IQM as `sketch_iqm`. Cost O(B x units) whatever n and the
    number of buckets; what this leaves out is the resampling variation inside a unit (second order).
    """
    return sketch_bootstrap_iqm_ci_of_counts(*sketch_distinct(counts, spec), num_resamples, seed, confidence,
                                             tail_margin, units)


def sketch_bootstrap_iqm_ci_of_counts(values: torch.Tensor, counts: torch.Tensor, tied: torch.Tensor,
                                      num_resamples: int = 1000, seed: int = 42, confidence: float = 0.95,
                                      tail_margin: float = TAIL_MARGIN, units: int = SKETCH_UNITS) -> torch.Tensor:
    """`sketch_bootstrap_iqm_ci` from the non-empty buckets ``(values, counts, tied)`` of `sketch_distinct`."""
    if counts.numel() == 0:
        return _nan((2,), counts.device)
    sample = _sketch_units(values.cpu(), counts.cpu(), tied.cpu(), tail_margin, units)
    replicates = _resample_iqms(*sample[:2], num_resamples, seed, tail_margin, *sample[2:])
    return _percentile_interval(replicates, confidence).to(counts.device)


def _sketch_units(values: torch.Tensor, counts: torch.Tensor, tied: torch.Tensor, tail_margin: float,
                  units: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[np.ndarray, np.ndarray]]:
    """Consecutive buckets (CPU) merged into resampling units ``(values, counts, tied, profile)``, a unit's value the
    count-weighted mean of its buckets', ``profile`` the points (x, g) of G (`_iqm_rows`: the buckets of a unit
    partly in the IQR are read in order).

    By a bucket's first rank: within w ranks of r25 or of r75 (w, r25, r75 as the module docstring), ``units``
    units of equal rank span each, and a tied bucket holding a quarter of a unit's ranks or more alone; between
    them 2 x ``units``; beyond, one unit per bucket (the tails: merged or split exactly by the resampling). A new
    unit also starts wherever the sign changes, so the zero bucket and the two signs are never merged.
    """
    v, c, t = values.numpy(), counts.numpy(), tied.numpy()
    n = int(c.sum())
    first = np.cumsum(c) - c
    width = math.ceil(tail_margin * math.sqrt(n))
    r25, r75 = math.floor(0.25 * (n - 1)), math.ceil(0.75 * (n - 1))
    bounds = np.array([r25 - width, r25 + width, max(r25 + width, r75 - width), max(r25 + width, r75 + width)], float)
    zone = np.searchsorted(bounds, first, side="right")  # 0 and 4: beyond the kept ranks
    span = np.maximum(np.concatenate([[1.0], np.diff(bounds), [1.0]]), 1)[zone]
    per_zone = np.array([0, units, 2 * units, units, 0], float)[zone]
    cell = np.floor((first - np.concatenate([[0.0], bounds])[zone]) / span * per_zone)
    alone = (zone % 4 == 0) | (t & (zone % 2 == 1) & (4 * c * per_zone >= span))  # near a quartile: big ties
    sign = np.sign(v)
    new = np.ones(v.size, dtype=bool)
    new[1:] = (zone[1:] != zone[:-1]) | (cell[1:] != cell[:-1]) | (sign[1:] != sign[:-1]) | alone[1:] | alone[:-1]
    unit = np.cumsum(new) - 1
    unit_counts, unit_sums = np.bincount(unit, weights=c), np.bincount(unit, weights=c * v)
    unit_tied = (np.bincount(unit) == 1) & (np.bincount(unit, weights=t) == 1)
    means = unit_sums / unit_counts
    # the profile G at each bucket's end: its unit + the unit's count so far over its count, and the means of the
    # units before + the unit's sum so far over its count
    count_so_far, sum_so_far = (np.cumsum(w) - (np.cumsum(total) - total)[unit]
                                for w, total in ((c, unit_counts), (c * v, unit_sums)))
    x = np.concatenate([[0.0], unit + count_so_far / unit_counts[unit]])
    g = np.concatenate([[0.0], (np.cumsum(means) - means)[unit] + sum_so_far / unit_counts[unit]])
    return torch.from_numpy(means), torch.from_numpy(unit_counts), torch.from_numpy(unit_tied), (x, g)
