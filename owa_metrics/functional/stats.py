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
  from ``rng = numpy.random.default_rng(seed)``: (1) ``rng.multinomial(n, [left, kept, right] / n, size=B)``
  (the samples in each group; empty tails left out); (2) each resample's kept counts given their total T, in
  order: ``rng.multinomial(T, kept / kept total)`` when there are at most max(256, kept samples / 8) kept
  values, else the ``bincount`` of ``rng.integers(0, kept total, size=T)`` read as kept samples in value order;
  (3) a resample whose left count exceeds r25 or whose right count reaches n - r75 (a quartile would read a
  tail value: about 1e-15 of them at tail_margin 4) has both tails split over their values by
  ``numpy.random.default_rng([seed, 1]).multinomial`` (left, then right). Every step is a conditional
  multinomial, so each resample is exactly one of resampling with replacement; without a split its IQM reads
  kept values only. The result is a function of the values and the seed: the same on any device and number of
  ranks. Cost after the sort: O(B x min(kept values, kept samples)), the kept values being those within w ranks
  of the IQR; sample by sample, one compiled loop makes numpy's stream itself and reads 4 resamples' counts
  per pass (`_sample_by_sample`), the same numbers as numpy's generator; value by value, a compiled loop makes
  numpy's multinomial draws itself (`_KeptMultinomial`, the same numbers) and another reads each resample's
  quartiles and weighted counts (`_covered_rows`).

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

try:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except Exception:  # noqa: BLE001 - without numba the vectorized path runs
    intrinsic = None

LANES = 4  # resamples counted together by position, 4 bits each (`_kept_draws_iqms`)
CHUNK_ELEMENTS = 1 << 15  # resamples per chunk: about this many counts (256 KB, below torch's parallel grain)
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
    numpy, whose generator draws)."""
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
    by_value = b - a <= max(BY_VALUE[0], kept_total / BY_VALUE[1])
    slot = None if by_value else np.repeat(np.arange(b - a), kept.astype(np.int64))  # sample -> kept value
    by_values = _KeptMultinomial(rng, kept / kept_total) if by_value else None

    def kept_counts(sizes: np.ndarray) -> np.ndarray:
        if by_value:
            return by_values.take(sizes)
        return np.stack([np.bincount(slot[rng.integers(0, kept_total, size=m)], minlength=b - a) for m in sizes])

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
        return _sample_by_sample(rng, groups, kept.astype(np.int64), slot, group_values.numpy(), n, int(totals[0]),
                                 width, resample_iqms)
    rows, out = max(1, CHUNK_ELEMENTS // (b - a + 2)), []
    for first in range(0, num_resamples, rows):  # loop over chunks of resamples, each vectorized
        chunk = groups[first:first + rows]
        out.append(resample_iqms(chunk, kept_counts(chunk[:, 1])))
    return torch.cat(out)


def _sample_by_sample(rng: np.random.Generator, groups: np.ndarray, kept: np.ndarray, slot: np.ndarray,
                      group_values: np.ndarray, n: int, left_total: int, width: int, resample_iqms) -> torch.Tensor:
    """`_resample_iqms` drawing the kept counts sample by sample (exact values, all finite; ``group_values`` as
    there), equal to the vectorized path: each resample's draws ``rng.integers(0, kept total, size=T)``
    (`_KeptDraws`), counted by position, are read by one compiled pass (`_kept_draws_iqms`) that counts them value
    by value only in the two zones of kept values whose ranks are within ``width`` of a quartile's, and sums the
    draws between the zones (all inside [Q25, Q75] while each quartile is in its zone): O(T + 4 width) per
    resample, not O(T + kept values). With numpy's method matched, one compiled loop makes every resample's draws
    and IQM (`_kept_resamples`). A resample whose tails must be split, or whose quartile leaves its zone (about
    never at tail_margin 4), is read from its counts by ``resample_iqms``, its draws made again by numpy."""
    has_left = int(left_total > 0)
    kept_values = group_values[has_left:has_left + kept.size]
    left_value, right_value = group_values[0], group_values[-1]  # read only when that tail has samples
    ends = np.cumsum(kept)
    first_rank, last_rank = left_total + ends - kept, left_total + ends - 1
    r25, r75 = math.floor(0.25 * (n - 1)), math.ceil(0.75 * (n - 1))
    width = max(width, math.ceil(TAIL_MARGIN * math.sqrt(n)))
    zone_b = int(np.searchsorted(first_rank, r25 + width, side="right"))  # kept values [0, zone_b): Q25's zone
    zone_c = max(zone_b, int(np.searchsorted(last_rank, r75 - width, side="left")))  # [zone_c, end): Q75's zone
    pos_b, pos_c = (int(ends[z - 1]) if z else 0 for z in (zone_b, zone_c))  # kept samples before each
    middle_values = np.repeat(kept_values[zone_b:zone_c], kept[zone_b:zone_c])  # by kept sample, between the zones
    h = [0.25 * (n - 1), 0.75 * (n - 1)]  # as `_quantile_rows`
    lo = [math.floor(x) for x in h]
    ranks = np.array([lo[0], min(lo[0] + 1, n - 1), lo[1], min(lo[1] + 1, n - 1)], dtype=np.int64)
    fine, drawn = np.empty((LANES, zone_b + kept.size - zone_c), dtype=np.int64), np.zeros(int(ends[-1]), np.uint16)
    layout = (slot, middle_values, kept_values, fine, zone_b, zone_c, pos_b, pos_c)
    iqms, done = np.empty(len(groups)), np.zeros(len(groups), dtype=np.bool_)
    draws, redo = _KeptDraws(rng, int(ends[-1])), {}  # redo: the others' draws, by resample
    if draws.own:
        starts = draws.resamples(groups, r25, n - r75, drawn, layout, left_value, right_value, ranks,
                                 h[0] - lo[0], h[1] - lo[1], iqms, done)
        redo = {i: (starts[i], int(groups[i, 1])) for i in np.flatnonzero(~done).tolist()}
    else:
        for i, (left, size, right) in enumerate(groups.tolist()):
            positions = rng.integers(0, draws.total, size=size)
            if left <= r25 and right < n - r75:
                _count_positions(positions, drawn)
                one, read = np.empty(LANES), np.zeros(LANES, dtype=np.bool_)
                _kept_draws_iqms(drawn, np.array([size, 0, 0, 0]), *layout, np.array([left, 0, 0, 0]), left_value,
                                 np.array([right, 0, 0, 0]), right_value, ranks, h[0] - lo[0], h[1] - lo[1], one, read)
                iqms[i], done[i] = one[0], read[0]
            if not done[i]:
                redo[i] = positions
    iqms, rest = torch.from_numpy(iqms), {}  # rest: the others' counts, by resample, in the order drawn

    def flush(rest: dict) -> None:  # in the order drawn (so are the tails' splits)
        if rest:
            iqms[list(rest)] = resample_iqms(groups[list(rest)], np.stack(list(rest.values())))
            rest.clear()

    for i, positions in redo.items():
        positions = draws.replay(*positions) if draws.own else positions
        rest[i] = np.bincount(slot[positions], minlength=kept.size)
        if len(rest) * (kept.size + 2) >= CHUNK_ELEMENTS:
            flush(rest)
    flush(rest)
    return iqms


@_jit
def _covered_rows(values, counts, ranks, weights, weighted, covered):
    """Per row i of ``counts`` [rows, K] (int64, rows of one total n) over the ascending ``values`` [K], as `_iqm_rows`
    without ``tied``: its quartiles Q25, Q75 (the order statistics of ``ranks`` (r25, r25 + 1, r75, r75 + 1, each
    below n) interpolated by ``weights``, `_quantile_rows`), ``weighted[i, j]`` = (``counts[i, j]`` where
    Q25 <= ``values[j]`` <= Q75, else 0) x ``values[j]``, ``covered[i]`` = their count: the IQM is
    ``weighted.sum(-1) / covered``."""
    cum, at = np.empty(counts.shape[1], dtype=np.int64), np.empty(4)
    for i in range(counts.shape[0]):
        total = 0
        for j in range(counts.shape[1]):
            total += counts[i, j]
            cum[j] = total
        for r in range(4):  # the value whose cumulative count first exceeds the rank
            at[r] = values[np.searchsorted(cum, ranks[r], side="right")]
        q25, q75 = _lerp_scalar(at[0], at[1], weights[0]), _lerp_scalar(at[2], at[3], weights[1])
        total = 0
        for j in range(counts.shape[1]):
            c = counts[i, j] if q25 <= values[j] <= q75 else 0
            weighted[i, j] = np.float64(c) * values[j]
            total += c
        covered[i] = total


@_jit
def _lerp_scalar(a: float, b: float, t: float) -> float:
    """`_lerp` of one pair."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


PCG64_MULTIPLIER = (2549297995355413924 << 64) + 4865540595714422341  # numpy's PCG64: state = state * M + inc
PCG_LANES = 4  # interleaved generator states (`_pcg_refill`, `_count8`: 4 outputs a step)


class _KeptDraws:
    """The kept draws of successive resamples, ``rng.integers(0, total, size=T)`` each, made by numpy's own method
    from the generator's stream, compiled: its PCG64 (128-bit LCG ``s <- s M + inc``, output XSL-RR of the new
    state) made as ``PCG_LANES`` interleaved states each stepping ``PCG_LANES`` at a time (the same outputs, in
    the same order, without each step waiting on the last), each 64-bit output read as two 32-bit words, low half
    first (a word left over in the generator comes first); Lemire's method: a word w gives ``(w total) >> 32``
    unless ``(w total) mod 2^32 < (2^32 - total) mod total``, then it is skipped. Checked against ``rng.integers``
    once per process (`_lemire_is_numpys`); where it differs (another numpy, another generator, a total past
    2^32 - 1) ``own`` is False and the caller draws with ``rng.integers``. `replay` draws a resample again with
    numpy's generator, advanced to where that resample began."""

    def __init__(self, rng: np.random.Generator, total: int, own: Optional[bool] = None):
        self.rng, self.total, self.threshold = rng, total, (2**32 - total) % total
        if own is None:
            own = (intrinsic is not None and total < 2**32 and type(rng.bit_generator) is np.random.PCG64
                   and _lemire_is_numpys())
        self.own = own
        if not self.own:
            return
        self.origin = rng.bit_generator.state
        state, inc = self.origin["state"]["state"], self.origin["state"]["inc"]
        mask, lanes, jump = (1 << 128) - 1, [], [1, 0]
        for _ in range(PCG_LANES):  # lane i holds the state after i + 1 steps; each then steps PCG_LANES at once
            state = (state * PCG64_MULTIPLIER + inc) & mask
            jump = [jump[0] * PCG64_MULTIPLIER & mask, (jump[1] * PCG64_MULTIPLIER + inc) & mask]
            lanes += [state >> 64, state & (2**64 - 1)]
        self.gen = np.array(lanes + [x >> shift & (2**64 - 1) for x in jump for shift in (64, 0)], dtype=np.uint64)
        self.out, self.pos = np.empty(PCG_LANES, dtype=np.uint64), np.empty(2 * PCG_LANES, dtype=np.int64)
        self.ok = np.zeros(2 * PCG_LANES, dtype=np.bool_)
        self.cursor = np.zeros(3, dtype=np.int64)  # next word in the queue, words in it, the stream index of its first
        if self.origin["has_uint32"]:  # the queue starts with the word left over
            m = self.origin["uinteger"] * total
            self.pos[0], self.ok[0], self.cursor[1] = m >> 32, m % 2**32 >= self.threshold, 1

    def _args(self):
        return self.gen, self.out, self.pos, self.ok, self.cursor, self.total, self.threshold

    def take(self, size: int) -> np.ndarray:
        """The next resample's ``size`` draws (positions)."""
        if not self.own:
            return self.rng.integers(0, self.total, size=size)
        into = np.empty(size, dtype=np.int64)
        _draw(*self._args(), size, np.empty(0, dtype=np.uint16), 0, into, 1)  # the types `_kept_resamples` uses
        return into

    def resamples(self, groups, r25, right_limit, drawn, layout, left_value, right_value, ranks, t25, t75, iqms,
                  done) -> np.ndarray:
        """`_kept_resamples` from here; the stream index of each resample's first word."""
        starts = np.empty(len(groups), dtype=np.int64)
        _kept_resamples(*self._args(), groups, r25, right_limit, drawn, *layout, left_value, right_value, ranks,
                        t25, t75, iqms, done, starts)
        return starts

    def replay(self, start: int, size: int) -> np.ndarray:
        """``size`` draws from the stream's word ``start`` on, made by numpy: ``rng.integers`` of its generator
        advanced there."""
        bit_generator, pre, start = np.random.PCG64(), self.origin["has_uint32"], int(start)
        if pre and start == 0:
            bit_generator.state = self.origin
        else:
            bit_generator.state = {**self.origin, "has_uint32": 0, "uinteger": 0}
            bit_generator.advance((start - pre) // 2)
            if (start - pre) % 2:  # from the high half of an output
                high = int(bit_generator.random_raw()) >> 32
                bit_generator.state = {**bit_generator.state, "has_uint32": 1, "uinteger": high}
        return np.random.Generator(bit_generator).integers(0, self.total, size=size)


@functools.lru_cache(maxsize=1)
def _lemire_is_numpys() -> bool:
    """Whether `_KeptDraws` gives what default_rng's ``integers`` gives (calls in a row, a word left over or not,
    past several refills), and `_KeptDraws.replay` what it drew."""
    for total in (3, 508_001, 2**31 + 5):
        for skip in (0, 1):
            numpys = np.random.default_rng(total)
            numpys.integers(0, total, size=skip)  # one word: one left over
            draws, sizes = _KeptDraws(numpys, total, own=True), (7, 100, 5003, 50)
            got, start = [draws.take(size) for size in sizes[:-1]], int(draws.cursor[2] + draws.cursor[0])
            got.append(draws.take(sizes[-1]))
            want = [numpys.integers(0, total, size=size) for size in sizes]
            if not all(np.array_equal(g, w) for g, w in zip(got, want)):
                return False
            if not np.array_equal(draws.replay(start, sizes[-1]), want[-1]):
                return False
    return True


class _KeptMultinomial:
    """The kept counts of successive resamples, ``rng.multinomial(T, p)`` each (``p``: the kept values' shares),
    made by numpy's own method from the generator's stream, compiled (`_multinomial_rows`): numpy's PCG64 (as
    `_KeptDraws`), a double ``(output >> 11) 2^-53`` per uniform, and per value j a binomial draw of what is left
    (``n_j`` samples) at ``p_j / (1 - p_0 - ... - p_{j-1})``: by inversion where ``n_j min(p', 1 - p')`` is at most
    30, else by BTPE (Kachitvichyanukul & Schmeiser), numpy's arithmetic step for step (the same operations in
    the same order, C's libm exp / log). Checked against ``rng.multinomial`` once per process
    (`_multinomial_is_numpys`); where it differs (another numpy, another generator) ``own`` is False and numpy
    draws. The per-value terms that do not depend on n (the binomial's p, its side, log(1 - p')) are made once."""

    def __init__(self, rng: np.random.Generator, shares: np.ndarray, own: Optional[bool] = None):
        self.rng, self.shares = rng, np.ascontiguousarray(shares, dtype=np.float64)
        if own is None:
            own = (intrinsic is not None and type(rng.bit_generator) is np.random.PCG64 and kernel_available()
                   and _multinomial_is_numpys())
        self.own = own
        if own:
            self.terms = np.empty((4, self.shares.size))
            _binomial_terms(self.shares, self.terms)
            state = rng.bit_generator.state["state"]
            self.gen = np.array([x >> shift & (2**64 - 1) for x in (state["state"], PCG64_MULTIPLIER, state["inc"])
                                 for shift in (64, 0)], dtype=np.uint64)

    def take(self, sizes: np.ndarray) -> np.ndarray:
        """The counts [len(sizes), values] of the next resamples, of ``sizes`` samples each; the generator (``rng``)
        is left where numpy's would be."""
        if not self.own:
            return self.rng.multinomial(sizes, self.shares)
        out = np.zeros((len(sizes), self.shares.size), dtype=np.int64)
        _multinomial_rows(self.gen, np.ascontiguousarray(sizes, dtype=np.int64), self.terms, out)
        state = self.rng.bit_generator.state
        state["state"]["state"] = int(self.gen[0]) << 64 | int(self.gen[1])
        self.rng.bit_generator.state = state
        return out


@functools.lru_cache(maxsize=1)
def _multinomial_is_numpys() -> bool:
    """Whether `_KeptMultinomial` gives what default_rng's ``multinomial`` gives, and leaves the generator where it
    does: shares that take every path (inversion and BTPE, each side of 1/2, the Stirling test of BTPE far from the
    mode, an early end), calls in a row, a 32-bit word left over in the generator or not."""
    shares = np.array([0.3, 1e-5, 0.002, 0.5, 0.0004, 0.15, 0.0476, 1e-6], dtype=np.float64)
    shares = shares / shares.sum()
    for skip in (0, 1):
        numpys, mine = np.random.default_rng(7 + skip), np.random.default_rng(7 + skip)
        for rng in (numpys, mine):
            rng.integers(0, 2**31, size=skip)
        draws = _KeptMultinomial(mine, shares, own=True)
        for sizes in ([0, 1, 7, 40], [100_000, 3_000_000, 25], [10**8, 5]):
            if not np.array_equal(draws.take(np.array(sizes)), numpys.multinomial(sizes, shares)):
                return False
        draws = _KeptMultinomial(mine, shares[::-1].copy(), own=True)
        if not np.array_equal(draws.take(np.array([1000, 200_000])), numpys.multinomial([1000, 200_000], shares[::-1])):
            return False
        if mine.integers(0, 2**62) != numpys.integers(0, 2**62) or mine.random() != numpys.random():
            return False
    return True


@_jit
def _binomial_terms(shares, terms):
    """Per value j the terms of its binomial draw that do not depend on how many samples are left (`_multinomial_rows`):
    ``p = shares[j] / (1 - shares[0] - ... - shares[j - 1])`` (the remainder subtracted value by value, as numpy),
    ``p' = min(p, 1 - p)`` as numpy forms it (``p``, or ``1 - p`` above 1/2), whether p is above 1/2, ``log(1 - p')``."""
    remaining = 1.0
    for j in range(shares.size):
        p = shares[j] / remaining
        side = p if p <= 0.5 else 1.0 - p
        terms[0, j], terms[1, j], terms[2, j], terms[3, j] = p, side, p > 0.5, math.log(1.0 - side)
        remaining -= shares[j]


@_jit
def _next_double(h, l, a_high, a_low, c_high, c_low):
    """``(u, h, l)``: the generator's next double in [0, 1) (numpy's ``next_double`` of PCG64: the new state's output
    >> 11, times 2^-53) and its new state."""
    h, l = _lcg_step(h, l, a_high, a_low, c_high, c_low)
    return np.float64(_xsl_rr(h, l) >> np.uint64(11)) * (1.0 / 9007199254740992.0), h, l


@_jit
def _multinomial_rows(gen, sizes, terms, out):
    """``out[i]``: numpy's ``multinomial(sizes[i], shares)`` (out zeroed; `_binomial_terms`' ``terms`` of the shares)
    row after row, from the PCG64 state ``gen`` (high, low of the state, the multiplier, the increment; advanced):
    value by value a binomial draw of the samples left, stopping when none is; the last value gets the rest."""
    h, l, a_high, a_low, c_high, c_low = gen[0], gen[1], gen[2], gen[3], gen[4], gen[5]
    d = out.shape[1]
    for i in range(sizes.size):
        n = sizes[i]
        for j in range(d - 1):
            if n == 0 or terms[0, j] == 0.0:
                continue
            side, flip = terms[1, j], terms[2, j] != 0.0
            if side * n <= 30.0:  # inversion
                q = 1.0 - side
                qn = math.exp(n * terms[3, j])
                mean = n * side
                bound = mean + 10.0 * math.sqrt(mean * q + 1)
                bound = np.int64(np.float64(n) if n < bound else bound)
                x, px = 0, qn
                u, h, l = _next_double(h, l, a_high, a_low, c_high, c_low)
                while u > px:
                    x += 1
                    if x > bound:
                        x, px = 0, qn
                        u, h, l = _next_double(h, l, a_high, a_low, c_high, c_low)
                    else:
                        u -= px
                        px = ((n - x + 1) * side * px) / (x * q)
            else:
                x, h, l = _btpe(n, side, h, l, a_high, a_low, c_high, c_low)
            x = n - x if flip else x
            out[i, j] = x
            n -= x
        if n > 0:
            out[i, d - 1] = n
    gen[0], gen[1] = h, l


@_jit
def _btpe(n, r, h, l, a_high, a_low, c_high, c_low):
    """``(y, h, l)``: numpy's BTPE binomial draw of n trials at r <= 1/2 (triangle, parallelogram, two exponential
    tails; the acceptance test by the recursive ratio near the mode, else by Stirling's bounds), its operations
    in numpy's order, and the generator's new state."""
    q = 1.0 - r
    fm = n * r + r
    m = np.int64(math.floor(fm))
    p1 = math.floor(2.195 * math.sqrt(n * r * q) - 4.6 * q) + 0.5
    xm = m + 0.5
    xl, xr = xm - p1, xm + p1
    c = 0.134 + 20.5 / (15.3 + m)
    a = (fm - xl) / (fm - xl * r)
    laml = a * (1.0 + a / 2.0)
    a = (xr - fm) / (xr * q)
    lamr = a * (1.0 + a / 2.0)
    p2 = p1 * (1.0 + 2.0 * c)
    p3 = p2 + c / laml
    p4 = p3 + c / lamr
    nrq = n * r * q
    while True:
        u, h, l = _next_double(h, l, a_high, a_low, c_high, c_low)
        v, h, l = _next_double(h, l, a_high, a_low, c_high, c_low)
        u *= p4
        if u <= p1:  # the triangle: accepted
            return np.int64(math.floor(xm - p1 * v + u)), h, l
        if u <= p2:  # the parallelogram
            x = xl + (u - p1) / c
            v = v * c + 1.0 - abs(m - x + 0.5) / p1
            if v > 1.0:
                continue
            y = np.int64(math.floor(x))
        elif u <= p3:  # the left tail (v == 0: rejected before its log is cast)
            if v == 0.0:
                continue
            y = np.int64(math.floor(xl + math.log(v) / laml))
            if y < 0:
                continue
            v = v * (u - p2) * laml
        else:  # the right tail
            if v == 0.0:
                continue
            y = np.int64(math.floor(xr - math.log(v) / lamr))
            if y > n:
                continue
            v = v * (u - p3) * lamr
        k = abs(y - m)
        if k <= 20 or k >= nrq / 2.0 - 1:  # the ratio f(y) / f(m), term by term
            s = r / q
            a = s * (n + 1)
            f = 1.0
            if m < y:
                for i in range(m + 1, y + 1):
                    f *= a / i - s
            elif m > y:
                for i in range(y + 1, m + 1):
                    f /= a / i - s
            if v > f:
                continue
            return y, h, l
        rho = (k / nrq) * ((k * (k / 3.0 + 0.625) + 0.16666666666666666) / nrq + 0.5)
        t = -k * k / (2 * nrq)
        big_a = math.log(v)
        if big_a < t - rho:
            return y, h, l
        if big_a > t + rho:
            continue
        x1, f1, z, w = np.float64(y + 1), np.float64(m + 1), np.float64(n + 1 - m), np.float64(n - y + 1)
        bound = (xm * math.log(f1 / x1) + (n - m + 0.5) * math.log(z / w) + (y - m) * math.log(w * r / (x1 * q))
                 + _stirling(f1) + _stirling(z) + _stirling(x1) + _stirling(w))
        if big_a > bound:
            continue
        return y, h, l


@_jit
def _stirling(x):
    """numpy's correction term of Stirling's formula in BTPE's bound, of x (its constants as numpy has them)."""
    x2 = x * x
    return (13680. - (462. - (132. - (99. - 140. / x2) / x2) / x2) / x2) / x / 166320.


if intrinsic is not None:
    @intrinsic
    def _mul_high(typingctx, a, b):
        """The high 64 bits of the 128-bit product of two uint64 (one instruction)."""
        def codegen(context, builder, signature, args):
            wide = ir.IntType(128)
            product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
            return builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
        return types.uint64(types.uint64, types.uint64), codegen

    @intrinsic
    def _add_lane4(typingctx, sums, counts, k, drawn, p, values, i):
        """``x = (drawn[p:p + 4] >> k) & 15`` (uint16 counts, 4 bits a resample); ``sums[k:k + 4] += x
        values[i:i + 4]`` (a multiply, then an add: no fused rounding) and ``counts[k:k + 4] += x``, as one step of
        4-wide vectors (numba leaves the scalar loop unvectorized)."""
        def codegen(context, builder, signature, args):
            arrays = [context.make_array(signature.args[j])(context, builder, args[j]).data for j in (0, 1, 3, 5)]
            f64, i64, i16 = ir.DoubleType(), ir.IntType(64), ir.IntType(16)
            wide, words, doubles = ir.VectorType(i64, 4), ir.VectorType(i16, 4), ir.VectorType(f64, 4)
            at = [builder.bitcast(builder.gep(a, [j]), t.as_pointer())
                  for a, j, t in zip(arrays, (args[2], args[2], args[4], args[6]), (doubles, wide, words, doubles))]
            shift = ir.Constant(wide, ir.Undefined)
            for j in range(4):
                shift = builder.insert_element(shift, args[2], ir.Constant(ir.IntType(32), j))
            x = builder.and_(builder.lshr(builder.zext(builder.load(at[2], align=2), wide), shift),
                             ir.Constant(wide, [15] * 4))
            product = builder.fmul(builder.uitofp(x, doubles), builder.load(at[3], align=8))
            builder.store(builder.fadd(builder.load(at[0], align=8), product), at[0], align=8)
            builder.store(builder.add(builder.load(at[1], align=8), x), at[1], align=8)
            return context.get_dummy_value()
        return types.void(sums, counts, k, drawn, p, values, i), codegen


@_jit
def _pcg_refill(gen, out, pos, ok, total, threshold):
    """The next ``out.size`` (a multiple of 4) PCG64 outputs from the 4 interleaved states ``gen[:8]`` (high, low
    each; ``gen[8:]``: the jump ``s <- s A + C`` of 4 steps), and each of their words' draw ``pos`` and whether it
    is kept ``ok`` (Lemire's, `_KeptDraws`)."""
    h0, l0, h1, l1, h2, l2, h3, l3 = gen[0], gen[1], gen[2], gen[3], gen[4], gen[5], gen[6], gen[7]
    a_high, a_low, c_high, c_low = gen[8], gen[9], gen[10], gen[11]
    for i in range(0, out.size, 4):
        out[i], out[i + 1], out[i + 2], out[i + 3] = (_xsl_rr(h0, l0), _xsl_rr(h1, l1), _xsl_rr(h2, l2),
                                                      _xsl_rr(h3, l3))
        h0, l0 = _lcg_step(h0, l0, a_high, a_low, c_high, c_low)
        h1, l1 = _lcg_step(h1, l1, a_high, a_low, c_high, c_low)
        h2, l2 = _lcg_step(h2, l2, a_high, a_low, c_high, c_low)
        h3, l3 = _lcg_step(h3, l3, a_high, a_low, c_high, c_low)
    gen[0], gen[1], gen[2], gen[3], gen[4], gen[5], gen[6], gen[7] = h0, l0, h1, l1, h2, l2, h3, l3
    words = out.view(np.uint32)  # low half first (little-endian; `_lemire_is_numpys` checks)
    scale, low, limit = np.uint64(total), np.uint64(0xFFFFFFFF), np.uint64(threshold)
    for j in range(words.size):
        m = np.uint64(words[j]) * scale
        pos[j] = np.int64(m >> np.uint64(32))
        ok[j] = (m & low) >= limit


@_jit
def _lcg_step(high, low, a_high, a_low, c_high, c_low):
    """``s A + C mod 2^128`` of s = (high, low)."""
    new_low = low * a_low + c_low
    carry = np.uint64(1) if new_low < c_low else np.uint64(0)
    return _mul_high(low, a_low) + low * a_high + high * a_low + c_high + carry, new_low


@_jit
def _xsl_rr(high, low):
    """PCG64's output of a state: ``(high ^ low)`` rotated right by the state's top 6 bits."""
    x, r = high ^ low, high >> np.uint64(58)
    return (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))


@_jit
def _draw(gen, out, pos, ok, cursor, total, threshold, size, drawn, add, into, how):
    """The next ``size`` draws of the stream (`_KeptDraws`): counted by position in ``drawn`` (``how`` 0: ``add``
    each), written to ``into`` (1) or passed over (2). ``cursor``: the queue's next word ``pos[j]``, its words,
    the stream index of its first. Counting, the words come straight from the generator 8 at a time (`_count8`)
    once the queue is empty, while at least 8 draws are wanted; the queue (refilled 4 outputs at a time) gives
    the others, word by word."""
    j, have, got = cursor[0], cursor[1], 0
    while got < size:
        if j == have and how == 0 and size - got >= 8:
            cursor[2] += have
            steps, got = _count8(gen, total, threshold, size - got, drawn, add, got)
            cursor[2] += 8 * steps
            j = have = 0
            continue
        if j == have:
            _pcg_refill(gen, out, pos, ok, total, threshold)
            cursor[2] += have
            j, have = 0, pos.size
        if ok[j]:
            if how == 0:
                drawn[pos[j]] += add
            elif how == 1:
                into[got] = pos[j]
            got += 1
        j += 1
    cursor[0], cursor[1] = j, have


@_jit
def _count8(gen, total, threshold, want, drawn, add, got):
    """``(steps, got)``: the generator's next 4 outputs, 8 words, at a time, each kept word's draw counted in
    ``drawn`` (``add``), while at least 8 of ``want`` draws remain (the 8 words' products made before any is
    counted, and tested for a skip at once: skips are rare)."""
    h0, l0, h1, l1, h2, l2, h3, l3 = gen[0], gen[1], gen[2], gen[3], gen[4], gen[5], gen[6], gen[7]
    a_high, a_low, c_high, c_low = gen[8], gen[9], gen[10], gen[11]
    low, half = np.uint64(0xFFFFFFFF), np.uint64(32)
    scale, limit = np.uint64(total) & low, np.uint64(threshold)
    steps, stop = 0, got + want - 8
    while got <= stop:
        o0, o1, o2, o3 = _xsl_rr(h0, l0), _xsl_rr(h1, l1), _xsl_rr(h2, l2), _xsl_rr(h3, l3)
        h0, l0 = _lcg_step(h0, l0, a_high, a_low, c_high, c_low)
        h1, l1 = _lcg_step(h1, l1, a_high, a_low, c_high, c_low)
        h2, l2 = _lcg_step(h2, l2, a_high, a_low, c_high, c_low)
        h3, l3 = _lcg_step(h3, l3, a_high, a_low, c_high, c_low)
        m0, m1, m2, m3 = (o0 & low) * scale, (o0 >> half) * scale, (o1 & low) * scale, (o1 >> half) * scale
        m4, m5, m6, m7 = (o2 & low) * scale, (o2 >> half) * scale, (o3 & low) * scale, (o3 >> half) * scale
        least = min(min(min(m0 & low, m1 & low), min(m2 & low, m3 & low)),
                    min(min(m4 & low, m5 & low), min(m6 & low, m7 & low)))
        if least >= limit:
            drawn[m0 >> half] += add
            drawn[m1 >> half] += add
            drawn[m2 >> half] += add
            drawn[m3 >> half] += add
            drawn[m4 >> half] += add
            drawn[m5 >> half] += add
            drawn[m6 >> half] += add
            drawn[m7 >> half] += add
            got += 8
        else:
            for m in (m0, m1, m2, m3, m4, m5, m6, m7):
                if (m & low) >= limit:
                    drawn[m >> half] += add
                    got += 1
        steps += 1
    gen[0], gen[1], gen[2], gen[3], gen[4], gen[5], gen[6], gen[7] = h0, l0, h1, l1, h2, l2, h3, l3
    return steps, got


@_jit
def _kept_resamples(gen, out, pos, ok, cursor, total, threshold, groups, r25, right_limit, drawn, slot,
                    middle_values, kept_values, fine, zone_b, zone_c, pos_b, pos_c, left_value, right_value, ranks,
                    t25, t75, iqms, done, starts):
    """Every resample of ``groups`` (left, kept, right counts) in turn: its kept draws from the stream (`_draw`,
    their first word's stream index in ``starts``), and where neither tail reaches a quartile, its IQM in ``iqms``
    and whether it could be read in ``done``, ``LANES`` resamples counted together (`_kept_draws_iqms`)."""
    member, sizes = np.zeros(LANES, dtype=np.int64), np.zeros(LANES, dtype=np.int64)
    lefts, rights = np.zeros(LANES, dtype=np.int64), np.zeros(LANES, dtype=np.int64)
    lane_iqms, lane_done, nowhere = np.empty(LANES), np.zeros(LANES, dtype=np.bool_), np.empty(0, dtype=np.int64)
    lane = 0
    for i in range(groups.shape[0] + 1):
        if lane == LANES or (lane and i == groups.shape[0]):
            _kept_draws_iqms(drawn, sizes, slot, middle_values, kept_values, fine, zone_b, zone_c, pos_b, pos_c, lefts,
                             left_value, rights, right_value, ranks, t25, t75, lane_iqms, lane_done)
            for r in range(lane):
                iqms[member[r]], done[member[r]] = lane_iqms[r], lane_done[r]
            sizes[:], lefts[:], rights[:], lane = 0, 0, 0, 0
        if i == groups.shape[0]:
            break
        left, size, right = groups[i, 0], groups[i, 1], groups[i, 2]
        starts[i] = cursor[2] + cursor[0]
        if left <= r25 and right < right_limit:
            _draw(gen, out, pos, ok, cursor, total, threshold, size, drawn, 1 << 4 * lane, nowhere, 0)
            member[lane], sizes[lane], lefts[lane], rights[lane] = i, size, left, right
            lane += 1
        else:
            _draw(gen, out, pos, ok, cursor, total, threshold, size, drawn, 0, nowhere, 2)
            done[i] = False


@_jit
def _count_positions(draws, drawn):
    for i in range(draws.size):
        drawn[draws[i]] += 1


@_jit
def _kept_draws_iqms(drawn, sizes, slot, middle_values, kept_values, fine, zone_b, zone_c, pos_b, pos_c, lefts,
                     left_value, rights, right_value, ranks, t25, t75, iqms, done):
    """The IQMs of the (up to) ``LANES`` resamples counted together by position in ``drawn`` (uint16, resample r
    in bits 4r to 4r + 3; zeroed here; ``slot``: each position's kept value), resample r made of ``lefts[r]``
    samples of ``left_value``, ``sizes[r]`` kept samples and ``rights[r]`` of ``right_value``: ``iqms[r]`` as
    `_iqm_rows` reads it, ``done[r]`` False when it cannot be read here (`_iqm_of_zones`). One pass over the
    positions for all of them: the zones' counts by value in ``fine[r]``, the values between them summed (four
    running sums each, so that the additions do not all wait on each other). A position drawn 16 times or more
    by one resample (never, in practice) carries into the next one's bits: it shows in the lowest such
    resample's total, and then none is done."""
    shift, totals = zone_c - zone_b, np.zeros(LANES, dtype=np.int64)
    fine[:, :] = 0
    for p in range(pos_b):
        c = np.int64(drawn[p])
        for r in range(LANES):
            fine[r, slot[p]] += (c >> 4 * r) & 15
    for p in range(pos_c, drawn.size):
        c = np.int64(drawn[p])
        for r in range(LANES):
            fine[r, slot[p] - shift] += (c >> 4 * r) & 15
    for r in range(LANES):
        totals[r] = fine[r].sum()
    # sums[4 r + q], counts[4 r + q]: resample r's draws times their values, its draws, over the positions q mod 4
    # from pos_b on, in order (4 of them at a time: `_add_lane4`)
    sums, counts = np.zeros(4 * LANES), np.zeros(4 * LANES, dtype=np.int64)
    end = pos_b + (pos_c - pos_b) // 4 * 4
    for p in range(pos_b, end, 4):
        for r in range(LANES):
            _add_lane4(sums, counts, 4 * r, drawn, p, middle_values, p - pos_b)
    for p in range(end, pos_c):  # the last positions: to the first sums
        c, v = np.int64(drawn[p]), middle_values[p - pos_b]
        for r in range(LANES):
            sums[4 * r] += ((c >> 4 * r) & 15) * v
            counts[4 * r] += (c >> 4 * r) & 15
    drawn[:] = 0
    between, n_between, carried = np.empty(LANES), np.empty(LANES, dtype=np.int64), False
    for r in range(LANES):
        between[r] = (sums[4 * r] + sums[4 * r + 1]) + (sums[4 * r + 2] + sums[4 * r + 3])
        n_between[r] = counts[4 * r:4 * r + 4].sum()
        carried |= totals[r] + n_between[r] != sizes[r]
    for r in range(LANES):
        iqms[r], done[r] = np.nan, False
        if not carried:
            iqms[r], done[r] = _iqm_of_zones(fine[r], n_between[r], between[r], lefts[r], left_value, rights[r],
                                             right_value, kept_values, zone_b, zone_c, ranks, t25, t75)


@_jit
def _iqm_of_zones(fine, n_between, between, left, left_value, right, right_value, kept_values, zone_b, zone_c,
                  ranks, t25, t75):
    """``(IQM, True)`` of a resample read from its zones' counts by value ``fine`` and the number and sum of its
    kept samples between the zones (`_kept_draws_iqms`), as `_iqm_rows` reads it; ``(nan, False)`` when a quartile
    reads a kept value between the zones (or the values between them are not all in [Q25, Q75])."""
    shift = zone_c - zone_b
    at = np.empty(4)  # the order statistics of ranks r25, r25 + 1, r75, r75 + 1 (`_quantile_rows`)
    k, cum = 0, left
    while k < 4 and ranks[k] < cum:
        at[k] = left_value
        k += 1
    for j in range(zone_b):
        cum += fine[j]
        while k < 4 and ranks[k] < cum:
            at[k] = kept_values[j]
            k += 1
    at_between, cum = k, cum + n_between
    if k < 4 and ranks[k] < cum:
        return np.nan, False
    for j in range(zone_c, kept_values.size):
        cum += fine[j - shift]
        while k < 4 and ranks[k] < cum:
            at[k] = kept_values[j]
            k += 1
    while k < 4:  # in the right tail
        at[k] = right_value
        k += 1
    q25, q75 = _lerp_scalar(at[0], at[1], t25), _lerp_scalar(at[2], at[3], t75)
    if n_between and not (at_between == 2 and q25 <= kept_values[zone_b] and kept_values[zone_c - 1] <= q75):
        return np.nan, False
    total, count = between, float(n_between)
    if left and q25 <= left_value <= q75:
        total += left * left_value
        count += left
    for j in range(zone_b):
        if fine[j] and q25 <= kept_values[j] <= q75:
            total += fine[j] * kept_values[j]
            count += fine[j]
    for j in range(zone_c, kept_values.size):
        if fine[j - shift] and q25 <= kept_values[j] <= q75:
            total += fine[j - shift] * kept_values[j]
            count += fine[j - shift]
    if right and q25 <= right_value <= q75:
        total += right * right_value
        count += right
    if count == 0:
        return np.nan, False
    return total / count, True


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
