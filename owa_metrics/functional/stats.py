"""Robust statistics on 1-D samples, exact or from a mergeable log-bucketed sketch.

Exact (float64, equal to numpy on the same values):

- quantile: linear interpolation between order statistics (``numpy.percentile`` default), any n: one
  sort and an index, so it has no size limit (``torch.quantile`` refuses more than 2^24 values).
- IQM: ``mean({x : Q25 <= x <= Q75})`` (inclusive), not the mean of the two quartiles. Two distinct
  values leave that set empty: NaN, as numpy.
- bootstrap CI of the IQM: B resamples of size n drawn with replacement from the *sorted* sample by
  ``numpy.random.default_rng(seed).integers(0, n, (B, n))``; CI = 2.5th / 97.5th percentiles of the
  replicate IQMs. Sorting first makes the result a function of the values alone (not of their order),
  so it is the same on any device and for any number of ranks.

Sketch (DDSketch-style, signed): a value x lands in bucket ``ceil(log_gamma |x|)`` on its sign's side,
``gamma = (1 + alpha) / (1 - alpha)``, and is read back as ``2 gamma^i / (gamma + 1)``: every order
statistic is within relative error alpha. Buckets are laid out in value order (negatives, zero, positives)
so that quantiles are cumulative counts. |x| below ``min_value`` counts as 0; above ``max_value`` it is
clamped to the top bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

CHUNK_ELEMENTS = 1 << 21  # bootstrap replicates are drawn in chunks of about this many indices


def _lerp(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """numpy's interpolation: ``a + (b - a) t``, computed from b's side when t >= 0.5."""
    diff = b - a
    return torch.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def quantile_sorted(xs: torch.Tensor, q) -> torch.Tensor:
    """Quantile(s) ``q`` in [0, 1] of an ascending 1-D tensor (linear interpolation); NaN when empty or when
    any value is NaN (sorting puts NaNs last), as numpy."""
    q = torch.as_tensor(q, dtype=torch.float64, device=xs.device)
    n = xs.numel()
    if n == 0 or bool(torch.isnan(xs[-1])):
        return torch.full_like(q, float("nan"))
    h = q * (n - 1)
    lo = h.floor().long()
    hi = (lo + 1).clamp(max=n - 1)
    return _lerp(xs[lo].double(), xs[hi].double(), h - lo)


def quantile(x: torch.Tensor, q) -> torch.Tensor:
    """Quantile(s) ``q`` in [0, 1] of the values of ``x`` (linear interpolation, any size); NaN when empty."""
    return quantile_sorted(x.reshape(-1).double().sort().values, q)


def iqm(x: torch.Tensor) -> torch.Tensor:
    """Interquartile mean: ``mean({x : Q25 <= x <= Q75})``; NaN when empty."""
    xs = x.reshape(-1).double().sort().values
    if xs.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64, device=x.device)
    q25, q75 = quantile_sorted(xs, [0.25, 0.75])
    return xs[(xs >= q25) & (xs <= q75)].mean()


def bootstrap_iqm_ci(x: torch.Tensor, num_resamples: int = 1000, seed: int = 42,
                     confidence: float = 0.95) -> torch.Tensor:
    """``[low, high]`` percentile bootstrap CI of the IQM (see the module docstring); NaN when empty.

    Vectorized per chunk of replicates: each resample is a vector of counts over the sorted values, so its
    quartiles are searches in the cumulative counts and its IQM a difference of cumulative sums.
    """
    xs = x.reshape(-1).double().sort().values
    n = xs.numel()
    if n == 0:
        return torch.full((2,), float("nan"), dtype=torch.float64, device=x.device)
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_ELEMENTS // n)
    replicates = []
    for first in range(0, num_resamples, chunk):  # loop over chunks of replicates, each fully vectorized
        index = torch.from_numpy(rng.integers(0, n, size=(min(chunk, num_resamples - first), n))).to(xs.device)
        counts = torch.zeros(index.shape, dtype=torch.float64, device=xs.device)
        counts.scatter_add_(1, index, torch.ones_like(counts))
        replicates.append(_iqm_of_counts(xs, counts))
    tail = (1 - confidence) / 2
    return quantile(torch.cat(replicates), [tail, 1 - tail])


def _iqm_of_counts(xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """IQM of each resample given as ``counts`` [k, n] over the ascending values ``xs`` [n]."""
    n = int(counts[0].sum().item())
    cum = counts.cumsum(1)
    cum_x = (counts * xs).cumsum(1)

    def order_stat(rank: int) -> torch.Tensor:  # the rank-th smallest value (0-based) of each resample
        target = torch.full((counts.shape[0], 1), float(min(rank, n - 1)), dtype=torch.float64, device=xs.device)
        return xs[torch.searchsorted(cum, target, right=True).squeeze(1)]

    def quartile(q: float) -> torch.Tensor:
        h = q * (n - 1)
        lo = math.floor(h)
        return _lerp(order_stat(lo), order_stat(lo + 1), torch.tensor(h - lo, dtype=torch.float64, device=xs.device))

    q25, q75 = quartile(0.25), quartile(0.75)
    a = torch.searchsorted(xs, q25, right=False)  # first value >= Q25
    b = torch.searchsorted(xs, q75, right=True) - 1  # last value <= Q75

    def before(cumulative: torch.Tensor, i: torch.Tensor) -> torch.Tensor:  # cumulative[i], 0 for i = -1
        return torch.where(i >= 0, cumulative.gather(1, i.clamp(min=0)[:, None]).squeeze(1), 0.0)

    total = before(cum_x, b) - before(cum_x, a - 1)
    count = before(cum, b) - before(cum, a - 1)
    return total / count


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
        x = x.double()
        m = self.buckets_per_sign
        k = torch.ceil(torch.log(x.abs().clamp(min=self.min_value)) / self.log_gamma) - self._k_min
        k = k.clamp(0, m - 1).long()
        tiny = x.abs() < self.min_value
        return torch.where(tiny, m, torch.where(x > 0, m + 1 + k, m - 1 - k))

    def values(self, device=None) -> torch.Tensor:
        """The value each bucket reads back as (within relative_accuracy of anything in it)."""
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
    counts = torch.bincount(bucket, weights=(~torch.isnan(x)).double(), minlength=groups * spec.size)
    return counts if group is None else counts.view(groups, spec.size)


def _compact(counts: torch.Tensor, spec: SketchSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-empty buckets: (values, counts), ascending."""
    keep = counts > 0
    return spec.values(counts.device)[keep], counts[keep]


def sketch_quantile(counts: torch.Tensor, spec: SketchSpec, q) -> torch.Tensor:
    """Quantile(s) ``q`` from bucket counts: each order statistic read from its bucket, then interpolated."""
    values, c = _compact(counts, spec)
    q = torch.as_tensor(q, dtype=torch.float64, device=counts.device)
    n = int(c.sum().item())
    if n == 0:
        return torch.full_like(q, float("nan"))
    cum = c.cumsum(0)
    h = q * (n - 1)
    lo = h.floor()
    at = lambda rank: values[torch.searchsorted(cum, rank.clamp(max=n - 1), right=True)]  # noqa: E731
    return _lerp(at(lo), at(lo + 1), h - lo)


def _rank_iqm(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """IQM of each row of bucket ``counts`` [k, K] over bucket ``values`` [K]: the mean of the order statistics
    with rank in [ceil(0.25 (n-1)), floor(0.75 (n-1))], each bucket contributing the ranks it covers."""
    cum = counts.cumsum(-1)
    n = cum[..., -1:]
    r_lo, r_hi = torch.ceil(0.25 * (n - 1)), torch.floor(0.75 * (n - 1))
    first_rank = cum - counts
    covered = (torch.minimum(cum - 1, r_hi) - torch.maximum(first_rank, r_lo) + 1).clamp(min=0)
    return (covered * values).sum(-1) / covered.sum(-1)


def sketch_iqm(counts: torch.Tensor, spec: SketchSpec) -> torch.Tensor:
    """IQM from bucket counts (rank-based: boundary buckets count for the ranks they cover); NaN when empty."""
    values, c = _compact(counts, spec)
    if c.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64, device=counts.device)
    return _rank_iqm(values, c[None])[0]


BOOTSTRAP_BLOCKS = 256


def sketch_bootstrap_iqm_ci(counts: torch.Tensor, spec: SketchSpec, num_resamples: int = 1000, seed: int = 42,
                            confidence: float = 0.95, blocks: int = BOOTSTRAP_BLOCKS) -> torch.Tensor:
    """``[low, high]`` bootstrap CI of the IQM from bucket counts; NaN when empty.

    Each resample is an exact Multinomial(n) draw (``numpy.random.default_rng(seed).multinomial``) over at
    most ``blocks`` runs of consecutive buckets holding about n / blocks values each, a run read back as
    the count-weighted mean of its buckets: the cost is num_resamples x blocks whatever n and the number of
    buckets; what this leaves out is the resampling variation inside a run (second order for the IQM).
    """
    values, c = _compact(counts.cpu(), spec)
    n = int(c.sum().item())
    if n == 0:
        return torch.full((2,), float("nan"), dtype=torch.float64, device=counts.device)
    block = ((c.cumsum(0) - c) * blocks / n).floor().long()  # consecutive buckets, about n / blocks values each
    block_counts = torch.zeros(blocks, dtype=torch.float64).index_add_(0, block, c)
    block_values = torch.zeros(blocks, dtype=torch.float64).index_add_(0, block, c * values)
    keep = block_counts > 0
    block_counts, block_values = block_counts[keep], block_values[keep] / block_counts[keep]
    draws = np.random.default_rng(seed).multinomial(n, (block_counts / n).numpy(), size=num_resamples)
    replicates = _rank_iqm(block_values, torch.from_numpy(draws).double())
    tail = (1 - confidence) / 2
    return quantile(replicates, [tail, 1 - tail]).to(counts.device)
