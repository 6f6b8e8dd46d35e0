"""Drawing the bootstrap's resamples (`stats._resample_iqms`) and reading their IQMs, compiled (numba).

Two generators, neither re-implemented here:

- numpy's ``default_rng(seed)``: the resamples' group totals (``multinomial``, called from Python) and, value by
  value, their kept counts ``multinomial(T, shares)``, made in a compiled loop from numba's own support for
  ``numpy.random.Generator`` (`_multinomial_rows`: value after value a ``binomial`` of the samples left, as numpy's
  multinomial; the same numbers, tested); without numba, numpy's ``multinomial`` itself.
- sample by sample, a counter-based SplitMix64 (Steele, Lea and Flood 2014): with ``mix(z)`` its output function
  (``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``, mod 2^64) and
  ``g = 0x9E3779B97F4A7C15``, resample i's key is ``k_i = mix(seed + (i + 1) g)`` and its j-th 64-bit word
  (j = 1, 2, ...) ``mix(k_i + j g)``; each word is two 32-bit words w (low half first), each a draw
  ``floor(w T / 2^32)`` in [0, T), skipped where ``w T mod 2^32 < (2^32 - T) mod T`` (Lemire's method: every
  position equally likely). A resample's draws depend on (seed, i) only: `draws` makes them with numpy, the
  compiled pass (`_count_draws`) the same ones.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..decode.kernel import _jit

try:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except Exception:  # noqa: BLE001 - without numba the vectorized path runs
    intrinsic = None

LANES = 4  # resamples counted together by position, 4 bits each (`_kept_draws_iqms`)
CHUNK_ELEMENTS = 1 << 15  # resamples per chunk: about this many counts (256 KB, below torch's parallel grain)
GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment, 2^64 / the golden ratio
LOW = np.uint64(0xFFFFFFFF)


@_jit
def _mix(z):
    """SplitMix64's output function of ``z`` (uint64, a scalar in compiled code or an array; wraps mod 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def resample_keys(seed: int, resamples: int) -> np.ndarray:
    """The keys ``k_i = mix(seed + (i + 1) g)`` of resamples 0 .. resamples - 1 (module docstring)."""
    return _mix(np.uint64(seed % 2**64) + GAMMA * np.arange(1, resamples + 1, dtype=np.uint64))


def draws(key: np.uint64, total: int, size: int) -> np.ndarray:
    """The ``size`` draws in [0, ``total``) (total < 2^32) of the resample of ``key``, in order (module docstring)."""
    threshold, first, got = (2**32 - total) % total, 1, [np.empty(0, dtype=np.uint64)]
    while sum(map(len, got)) < size:
        count = (size - sum(map(len, got))) // 2 + 16
        words = _mix(np.uint64(key) + GAMMA * np.arange(first, first + count, dtype=np.uint64))
        products = np.stack([words & LOW, words >> np.uint64(32)], axis=1).reshape(-1) * np.uint64(total)
        got.append(products[(products & LOW) >= threshold] >> np.uint64(32))
        first += count
    return np.concatenate(got)[:size].astype(np.int64)


@_jit
def _count_draws(key, total, threshold, size, drawn, add):
    """Adds ``add`` to ``drawn[p]`` for each of the ``size`` draws p of the resample of ``key`` (`draws`, compiled):
    while 8 or more are left, 4 words at a time, their 8 products tested together (a skip is rare) before any is
    counted; the last ones word by word."""
    scale, limit, half, step = np.uint64(total), np.uint64(threshold), np.uint64(32), np.uint64(4) * GAMMA
    z, got = np.uint64(key), 0
    while got + 8 <= size:
        w0, w1, w2, w3 = _mix(z + GAMMA), _mix(z + np.uint64(2) * GAMMA), _mix(z + np.uint64(3) * GAMMA), _mix(z + step)
        z += step
        m0, m1, m2, m3 = (w0 & LOW) * scale, (w0 >> half) * scale, (w1 & LOW) * scale, (w1 >> half) * scale
        m4, m5, m6, m7 = (w2 & LOW) * scale, (w2 >> half) * scale, (w3 & LOW) * scale, (w3 >> half) * scale
        if min(min(min(m0 & LOW, m1 & LOW), min(m2 & LOW, m3 & LOW)),
               min(min(m4 & LOW, m5 & LOW), min(m6 & LOW, m7 & LOW))) >= limit:
            drawn[m0 >> half] += add
            drawn[m1 >> half] += add
            drawn[m2 >> half] += add
            drawn[m3 >> half] += add
            drawn[m4 >> half] += add
            drawn[m5 >> half] += add
            drawn[m6 >> half] += add
            drawn[m7 >> half] += add
            got += 8
            continue
        for m in (m0, m1, m2, m3, m4, m5, m6, m7):
            if (m & LOW) >= limit:
                drawn[m >> half] += add
                got += 1
    while got < size:
        z += GAMMA
        word = _mix(z)
        low, high = (word & LOW) * scale, (word >> half) * scale
        if (low & LOW) >= limit:
            drawn[low >> half] += add
            got += 1
        if got < size and (high & LOW) >= limit:
            drawn[high >> half] += add
            got += 1


@_jit
def _multinomial_rows(rng, sizes, shares, out):
    """``out[i]`` (zeroed) = ``rng.multinomial(sizes[i], shares)`` for each i in turn: value by value a binomial
    draw (numba's ``Generator.binomial``) of the samples left at the value's share of what is left, until none
    is; the last value gets the rest."""
    for i in range(sizes.size):
        left, rest = sizes[i], 1.0
        for j in range(shares.size - 1):
            x = rng.binomial(left, shares[j] / rest)
            out[i, j] = x
            left -= x
            if left <= 0:
                break
            rest -= shares[j]
        if left > 0:
            out[i, shares.size - 1] = left


def multinomial_rows(rng: np.random.Generator, sizes: np.ndarray, shares: np.ndarray, compiled: bool) -> np.ndarray:
    """``rng.multinomial(sizes, shares)`` [len(sizes), len(shares)]: compiled (`_multinomial_rows`) or numpy's."""
    if not compiled:
        return rng.multinomial(sizes, shares)
    out = np.zeros((len(sizes), len(shares)), dtype=np.int64)
    _multinomial_rows(rng, np.ascontiguousarray(sizes, dtype=np.int64), np.ascontiguousarray(shares, np.float64), out)
    return out


def sample_by_sample(keys: np.ndarray, groups: np.ndarray, kept: np.ndarray, slot: np.ndarray,
                     group_values: np.ndarray, n: int, left_total: int, width: int, resample_iqms) -> torch.Tensor:
    """`stats._resample_iqms`' IQMs drawing the kept counts sample by sample (exact values, all finite;
    ``group_values`` as there; ``keys``: the resamples', `resample_keys`), equal to the vectorized path: one compiled
    call (`_kept_resamples`) counts each resample's draws (`_count_draws`) by position and reads them in a pass
    (`_kept_draws_iqms`) that counts them value by value only in the two zones of kept values whose ranks are within
    ``width`` of a quartile's, and sums the draws between the zones (all inside [Q25, Q75] while each quartile is in
    its zone): O(T + 4 width) per resample, not O(T + kept values). A resample whose tails must be split, or whose
    quartile leaves its zone (about never at tail_margin 4), is read from its counts by ``resample_iqms``, its
    draws made again (`draws`)."""
    has_left = int(left_total > 0)
    kept_values = group_values[has_left:has_left + kept.size]
    left_value, right_value = group_values[0], group_values[-1]  # read only when that tail has samples
    ends = np.cumsum(kept)
    first_rank, last_rank = left_total + ends - kept, left_total + ends - 1
    r25, r75 = math.floor(0.25 * (n - 1)), math.ceil(0.75 * (n - 1))
    zone_b = int(np.searchsorted(first_rank, r25 + width, side="right"))  # kept values [0, zone_b): Q25's zone
    zone_c = max(zone_b, int(np.searchsorted(last_rank, r75 - width, side="left")))  # [zone_c, end): Q75's zone
    pos_b, pos_c = (int(ends[z - 1]) if z else 0 for z in (zone_b, zone_c))  # kept samples before each
    middle_values = np.repeat(kept_values[zone_b:zone_c], kept[zone_b:zone_c])  # by kept sample, between the zones
    h = [0.25 * (n - 1), 0.75 * (n - 1)]  # as `_quantile_rows`
    lo = [math.floor(x) for x in h]
    ranks = np.array([lo[0], min(lo[0] + 1, n - 1), lo[1], min(lo[1] + 1, n - 1)], dtype=np.int64)
    total = int(ends[-1])
    fine, drawn = np.empty((LANES, zone_b + kept.size - zone_c), dtype=np.int64), np.zeros(total, np.uint16)
    iqms, done = np.empty(len(groups)), np.zeros(len(groups), dtype=np.bool_)
    _kept_resamples(keys, total, (2**32 - total) % total, groups, r25, n - r75, drawn, slot, middle_values,
                    kept_values, fine, zone_b, zone_c, pos_b, pos_c, left_value, right_value, ranks, h[0] - lo[0],
                    h[1] - lo[1], iqms, done)
    iqms, rest = torch.from_numpy(iqms), {}  # rest: the others' counts, by resample, in order

    def flush(rest: dict) -> None:  # in order (so are the tails' splits)
        if rest:
            iqms[list(rest)] = resample_iqms(groups[list(rest)], np.stack(list(rest.values())))
            rest.clear()

    for i in np.flatnonzero(~done).tolist():
        rest[i] = np.bincount(slot[draws(keys[i], total, int(groups[i, 1]))], minlength=kept.size)
        if len(rest) * (kept.size + 2) >= CHUNK_ELEMENTS:
            flush(rest)
    flush(rest)
    return iqms


@_jit
def _kept_resamples(keys, total, threshold, groups, r25, right_limit, drawn, slot, middle_values, kept_values, fine,
                    zone_b, zone_c, pos_b, pos_c, left_value, right_value, ranks, t25, t75, iqms, done):
    """Every resample i of ``groups`` (left, kept, right counts) where neither tail reaches a quartile: its kept
    draws (`_count_draws`, key ``keys[i]``) and its IQM in ``iqms[i]``, whether it could be read in ``done[i]``,
    ``LANES`` resamples counted together (`_kept_draws_iqms`); the others not done."""
    member, sizes = np.zeros(LANES, dtype=np.int64), np.zeros(LANES, dtype=np.int64)
    lefts, rights = np.zeros(LANES, dtype=np.int64), np.zeros(LANES, dtype=np.int64)
    lane_iqms, lane_done = np.empty(LANES), np.zeros(LANES, dtype=np.bool_)
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
        done[i] = False
        if left <= r25 and right < right_limit:
            _count_draws(keys[i], total, threshold, size, drawn, 1 << 4 * lane)
            member[lane], sizes[lane], lefts[lane], rights[lane] = i, size, left, right
            lane += 1


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


if intrinsic is not None:
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


