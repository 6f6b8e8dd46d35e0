"""Generation by time (``pairing="time"``): generated events matched to true events within a tolerance.

Both sides are unwrapped to absolute time along each row (`unwrap_ns`), then matched with one greedy rule
(`greedy_match`) twice: detection (key = category and detail) and, over what is left, pairing (key = kind).
The pairs feed every existing metric; the detection matches give per-category precision / recall / F1.
No Python loop over events or rows: torch ops, and for the greedy choice a compiled scan on the CPU or, elsewhere,
a loop over the k-th events of all rows at once, as many steps as the longest row has events, or for long rows a
bounded loop over deferred-acceptance rounds (`greedy_match`).
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import replace
from typing import NamedTuple, Optional, Union

import numpy as np
import torch

from ..schema import CATEGORY_NAMES, Category, Status
from . import kernel
from .event_batch import Backend, EventBatch, EventFields, TimeMatching

N_CAT = len(CATEGORY_NAMES)
STEP_BACK_NS = 1_000_000_000  # a step of more than W - 1 s is a step back (the generated time went backwards)
_ROW_SHIFT, _CATEGORY_SHIFT = 2 ** 40, 2 ** 34  # match keys packed into one int64: row, category, detail
DEFAULT_TOLERANCE_MS = 100.0  # pairing="time" without a tolerance_ms


def tolerance_ns(tolerance_ms: Union[float, tuple], window_ns: int) -> Union[int, tuple[int, ...]]:
    """``tolerance_ms`` as whole ns, checked: 0 <= tolerance < W / 2 (so a pair's wrapped timestamp error is
    exactly a_p - a_t); a sweep (a tuple or list of distinct tolerances) -> a tuple, each checked."""
    if isinstance(tolerance_ms, (tuple, list)):
        sweep = tuple(tolerance_ns(t, window_ns) for t in tolerance_ms)
        if not sweep or len(set(sweep)) < len(sweep):
            raise ValueError(f"a tolerance_ms sweep is a non-empty tuple of distinct tolerances (ms), got "
                             f"{tolerance_ms!r}")
        return sweep
    if isinstance(tolerance_ms, bool) or not isinstance(tolerance_ms, numbers.Real) or not math.isfinite(tolerance_ms):
        raise ValueError(f"tolerance_ms must be a finite number of milliseconds, got {tolerance_ms!r}")
    ns = round(tolerance_ms * 1_000_000)
    if not 0 <= ns < window_ns // 2:
        raise ValueError(f"tolerance_ms must be in [0, {window_ns / 2e6:g}) (half the format's "
                         f"{window_ns / 1e9:g} s timestamp window), got {tolerance_ms!r}")
    return ns


def unwrap_ns(seq: torch.Tensor, timestamp_ns: torch.Tensor, valid: torch.Tensor, origin_ns: torch.Tensor,
              window_ns: int) -> torch.Tensor:
    """Absolute times [n] of events in (row, position) order (0 where not ``valid``; invalid events are skipped).

    With W = ``window_ns`` and o = ``origin_ns[row]``: a_0 = o + signed(t_0 - o), signed() into [-W/2, W/2);
    then d = (t_k - t_{k-1}) mod W and a_k = a_{k-1} + d, or a_{k-1} + d - W when d > W - 1 s (a step back).
    One segmented cumulative sum over every event (an invalid one steps 0; each valid one steps from the last valid
    one before it), fixed shapes: no host sync.
    """
    n = len(timestamp_ns)
    if n == 0:
        return torch.zeros_like(timestamp_ns)
    seq = seq if seq.dtype == torch.long else seq.long()
    index = torch.arange(n, device=seq.device)
    before = torch.nn.functional.pad(torch.where(valid, index, -1).cummax(0).values[:-1], (1, 0), value=-1)
    at = before.clamp(min=0)  # the last valid event before each one (-1: none)
    first = valid & ((before < 0) | (seq.index_select(0, at) != seq))  # its row's first valid event
    t = timestamp_ns
    step = torch.remainder(t - t.index_select(0, at), window_ns)
    step = torch.where(step > window_ns - STEP_BACK_NS, step - window_ns, step)
    o = origin_ns.index_select(0, seq)
    half = window_ns // 2
    step = torch.where(first, o + torch.remainder(t - o + half, window_ns) - half, torch.where(valid, step, 0))
    total = torch.cumsum(step, 0)
    row_start = torch.cummax(torch.where(first, index, 0), 0).values
    # the cumulative sum restarted at each row
    return torch.where(valid, total - (total - step).index_select(0, row_start), 0)


class Lanes(NamedTuple):
    """A schedule of `greedy_match`'s targets in lanes that no key crosses (e.g. the rows, when the keys hold the
    row), so that lanes never compete, with bounds known on the host: ``table`` [depth x lanes], the k-th target of
    each lane (in order of time, ties: position; n_targets: none) at row k (`lane_table`); at most ``width``
    candidates with a target's key; no tolerance above ``tolerance_ns``."""

    table: torch.Tensor
    lanes: int
    width: int
    tolerance_ns: int


def lane_table(target_ns: torch.Tensor, lane: torch.Tensor, lanes: int, depth: int) -> torch.Tensor:
    """[depth x lanes] flat: the targets of each lane (``lane`` [n], in [0, ``lanes``), at most ``depth`` a lane) in
    order of time, ties: position (n: none); fixed shapes, no host sync."""
    n = target_ns.numel()
    by_time = torch.argsort(target_ns, stable=True)
    by_lane = by_time.index_select(0, torch.argsort(lane.index_select(0, by_time), stable=True))
    lane = lane.index_select(0, by_lane)
    k = torch.arange(n, device=lane.device) - torch.searchsorted(lane, lane)  # its rank in its lane
    return torch.full((depth * lanes,), n, dtype=torch.long, device=lane.device).index_copy_(
        0, torch.add(lane, k, alpha=lanes), by_lane)


# `row_lanes`' limits: steps of the fixed-shape matching (5 kernels each) and entries of its tables ([steps, lanes,
# width] int64); longer rows (offline recordings) take deferred acceptance, whose rounds follow the chains of displaced
# targets instead of the rows' lengths
LANE_STEPS, LANE_ENTRIES = 256, 2 ** 22


def row_lanes(target_ns: torch.Tensor, target_seq: torch.Tensor, num_sequences: int,
              event_bound: Optional[tuple[int, int]], tolerance_ns: int, copies: int = 1) -> Optional[Lanes]:
    """The rows as `Lanes` (the match keys hold the row) from the most events in a row of each side (``event_bound``,
    `EventBatch.event_bound`); None when not known, or beyond `LANE_STEPS` steps or `LANE_ENTRIES` entries of the
    tables (x ``copies``, a sweep's)."""
    if event_bound is None:
        return None
    depth, width = event_bound
    if depth > LANE_STEPS or depth * num_sequences * width * copies > LANE_ENTRIES:
        return None
    return Lanes(lane_table(target_ns, target_seq, num_sequences, depth), num_sequences, width, tolerance_ns)


def greedy_match(target_key: torch.Tensor, target_ns: torch.Tensor, pred_key: torch.Tensor, pred_ns: torch.Tensor,
                 tolerance_ns: Union[int, torch.Tensor], backend: Backend = "auto", lanes: Optional[Lanes] = None
                 ) -> torch.Tensor:
    """The greedy rule: for each target in order of time (ties: position), the still unmatched candidate with the
    same key and the smallest |a_p - a_t| <= ``tolerance_ns`` (one, or one per target) (ties: the earlier
    candidate). Both sides in position order (index order); keys include the row. Returns [n_targets] candidate
    indices (-1: none).

    Each target's window (its key's candidates within the tolerance) is a slice of the candidates sorted by (key,
    time): a few sorts and two searches. On the CPU with numba (``backend`` as `decode_batch`), the E edges
    (target, candidate) sorted by (target order, distance, candidate), then one compiled scan takes each target's
    first free candidate: the sequential rule itself, O((n + E) log(n + E)). Elsewhere, with ``lanes`` (`Lanes`: no
    key crosses two, bounds known on the host; `row_lanes`), the same rule in fixed-shape torch ops without a host
    sync (`_in_lanes`: the k-th targets of all lanes at once, for k = 1 .. the most targets of a lane). Without,
    deferred acceptance in torch ops over the edges (their number read): each round every unmatched target proposes
    to its best candidate not held by an earlier target; a candidate keeps its earliest proposer (or holder), the
    others propose again. All candidates rank targets by the same order, so the result is the unique stable
    matching, which is the sequential greedy one. Each round the earliest unmatched proposer of every row gets a
    candidate that it keeps, so there are at most as many rounds as the longest row has targets; in practice the
    longest chain of displaced targets: 1 to 3 for sparse events, ~60 for a 2,000-event row of dense mouse moves.
    Each round costs O(E) in fixed-shape ops (`_deferred_acceptance`).
    """
    n_t, n_p = target_ns.numel(), pred_ns.numel()
    match = torch.full((n_t,), -1, dtype=torch.long, device=target_ns.device)
    if n_t == 0 or n_p == 0:
        return match
    # candidates sorted by (key, time); each target's window [a_t - tol, a_t + tol] within its key is a slice
    group, p_group = _dense_rank(torch.cat([target_key, pred_key])).split([n_t, n_p])
    p_rank, low, high = _dense_rank(torch.cat([pred_ns, target_ns - tolerance_ns, target_ns + tolerance_ns])).split(
        [n_p, n_t, n_t])
    times = n_p + 2 * n_t  # more than the distinct times: (group, time rank) as one ordered number
    sort_key = torch.add(p_rank, p_group, alpha=times)
    order = torch.argsort(sort_key, stable=True)
    sorted_key = sort_key.index_select(0, order)
    lo = torch.searchsorted(sorted_key, torch.add(low, group, alpha=times))
    count = torch.searchsorted(sorted_key, torch.add(high, group, alpha=times), right=True) - lo
    compiled = backend != "torch" and target_ns.device.type == "cpu" and kernel.available()
    if not compiled and lanes is not None:
        return _in_lanes(pred_ns, target_ns, order, lo, count, lanes) if lanes.width else match
    e_t = torch.repeat_interleave(torch.arange(n_t, device=count.device), count)
    n_e = e_t.numel()
    if n_e == 0:
        return match
    offset = torch.arange(n_e, device=count.device) - (torch.cumsum(count, 0) - count).index_select(0, e_t)
    e_c = order.index_select(0, lo.index_select(0, e_t) + offset)
    # targets' priority: time, then position; edges in priority order, each target's by (distance, candidate)
    priority = torch.empty_like(match)
    by_priority = torch.argsort(target_ns, stable=True)
    priority[by_priority] = torch.arange(n_t, device=match.device)
    distance = (pred_ns.index_select(0, e_c) - target_ns.index_select(0, e_t)).abs()
    edge_order = torch.argsort(e_c, stable=True)
    edge_order = edge_order.index_select(0, torch.argsort(distance.index_select(0, edge_order), stable=True))
    e_p = priority.index_select(0, e_t).index_select(0, edge_order)
    edge_order = edge_order.index_select(0, torch.argsort(e_p, stable=True))
    e_t, e_c = e_t.index_select(0, edge_order), e_c.index_select(0, edge_order)
    if compiled:
        return torch.from_numpy(_first_free(e_t.numpy(), e_c.numpy(), n_t, n_p))
    return _deferred_acceptance(priority.index_select(0, e_t), e_c, by_priority, n_p)


_NONE = 2 ** 62  # no candidate (outside the window, or taken): above every key distance x (n_p + 1) + candidate


def _in_lanes(pred_ns: torch.Tensor, target_ns: torch.Tensor, order: torch.Tensor, lo: torch.Tensor,
              count: torch.Tensor, lanes: Lanes) -> torch.Tensor:
    """`greedy_match`'s rule in fixed shapes, without a host sync: each target of ``lanes.table`` with its window
    (``count`` candidates from ``lo`` in the sorted candidates ``order``) as keys distance x (n_p + 1) + candidate,
    a table [depth, lanes, width]. Step k: the k-th target of every lane takes its free candidate of smallest key (one
    ``min``), which is then taken: ``depth`` steps of 5 ops on [lanes, width] entries."""
    n_t, n_p, device = target_ns.numel(), pred_ns.numel(), target_ns.device
    L, K_w = lanes.lanes, lanes.width
    K = lanes.table.numel() // L
    lo_t, count_t, a_t = torch.nn.functional.pad(torch.stack([lo, count, target_ns], 1), (0, 0, 0, 1)).index_select(
        0, lanes.table).view(K, L, 3).split(1, 2)
    w = torch.arange(K_w, device=device)
    outside = w >= count_t
    slot = (lo_t + w).masked_fill_(outside, n_p)  # [K, L, K_w]: the candidates' slots in ``order`` (n_p: none)
    order = torch.nn.functional.pad(order, (0, 1))  # (slot n_p: a candidate whose key is none)
    candidate = order.index_select(0, slot.view(-1))  # in place from here: the tables are the largest tensors
    distance = pred_ns.index_select(0, candidate).view_as(slot).sub_(a_t).abs_()
    if lanes.tolerance_ns * (n_p + 1) + n_p >= _NONE:  # distance x (n_p + 1) would overflow: its rank instead
        distance = _dense_rank(distance.view(-1)).view_as(distance)
    key = candidate.view_as(slot).add_(distance, alpha=n_p + 1).masked_fill_(outside, _NONE)
    free = torch.arange(n_p + 1, device=device) < n_p  # slot n_p: no candidate
    best, chosen = torch.empty((2, K, L, 1), dtype=torch.long, device=device)
    at, taken = torch.empty((L, 1), dtype=torch.long, device=device), free.new_zeros((L, 1))
    for slots, keys, best_k, chosen_k in zip(slot, key, best, chosen):
        torch.min(torch.where(free.take(slots), keys, _NONE), 1, keepdim=True, out=(best_k, at))
        torch.gather(slots, 1, at, out=chosen_k)  # none open: a taken slot (or n_p), which stays taken
        free.put_(chosen_k, taken)
    found = torch.where(best < _NONE, order.take(chosen), -1)
    return torch.empty(n_t + 1, dtype=torch.long, device=device).index_copy_(0, lanes.table, found.view(-1))[:n_t]


@functools.lru_cache(maxsize=16)
def _on_device(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, made once (no copy from the host per update)."""
    return torch.tensor(values, dtype=torch.long, device=device)


def _dense_rank(x: torch.Tensor) -> torch.Tensor:
    """Each entry's rank among the distinct values of ``x`` (``torch.unique(x, return_inverse=True)[1]``) from a
    sort, without a host sync."""
    order = torch.argsort(x)
    ordered = x.index_select(0, order)
    return torch.empty_like(order).index_copy_(0, order, torch.diff(ordered, prepend=ordered[:1]).ne_(0).cumsum(0))


def _deferred_acceptance(e_p: torch.Tensor, e_c: torch.Tensor, by_priority: torch.Tensor, n_p: int) -> torch.Tensor:
    """`greedy_match`'s rounds on edges (target priority, candidate) sorted by (priority, preference), in
    fixed-shape ops: a round after the last change changes nothing, so the rounds run in runs of 2, 4, 8, ...
    and only the end of a run reads whether an edge was open (log2(rounds) host syncs, not several a round; one for
    the one or two rounds of sparse events, at the cost of at most one round that changes nothing)."""
    n_t, n_e = by_priority.numel(), e_p.numel()
    device = e_p.device
    edge, targets, candidates = (torch.arange(n, device=device) for n in (n_e, n_t, n_p))
    holder = torch.full((n_p + 1,), n_t, dtype=torch.long, device=device)  # priority of the holder; n_p: no one's
    matched = torch.full((n_t + 1,), -1, dtype=torch.long, device=device)  # by priority; n_t: no one's
    run = 2
    while True:
        for _ in range(run):
            # an edge is open if its target holds nothing and its candidate is free or held by a later target
            open_ = (matched.index_select(0, e_p) < 0) & (e_p < holder.index_select(0, e_c))
            best = torch.full((n_t,), n_e, device=device).scatter_reduce_(
                0, e_p, torch.where(open_, edge, n_e), "amin")  # each target's preferred open edge
            proposing = best < n_e
            chosen = e_c.index_select(0, best.clamp(max=n_e - 1))
            holder.scatter_reduce_(0, torch.where(proposing, chosen, n_p), torch.where(proposing, targets, n_t), "amin")
            matched = torch.full_like(matched, -1).scatter_(0, holder[:n_p], candidates)  # one candidate a target
        if not bool(open_.any()):
            return torch.empty_like(matched[:n_t]).index_copy_(0, by_priority, matched[:n_t])
        run *= 2


@kernel._jit
def _first_free(e_t, e_c, n_t, n_p):
    """Edges sorted by (target order, preference): each target takes its first candidate not yet taken."""
    match = np.full(n_t, -1, dtype=np.int64)
    taken = np.zeros(n_p, dtype=np.bool_)
    for k in range(e_t.shape[0]):
        if match[e_t[k]] < 0 and not taken[e_c[k]]:
            match[e_t[k]] = e_c[k]
            taken[e_c[k]] = True
    return match


def detection_key(seq: torch.Tensor, side: EventFields) -> torch.Tensor:
    """Row, category and detail: keyboard (vk, action), mouse_op button_flags, nothing for the others."""
    category = side.category
    detail = torch.where(category == int(Category.KEYBOARD), side.vk * 2 + side.action,
                         torch.where(category == int(Category.MOUSE_OP), side.button_flags, 0))
    return seq * _ROW_SHIFT + category * _CATEGORY_SHIFT + detail


def match_by_time(target: EventFields, target_seq: torch.Tensor, pred: EventFields, pred_seq: torch.Tensor,
                  num_sequences: int, window_ns: int, tolerance_ns: Union[int, tuple],
                  origin_ns: Optional[torch.Tensor] = None, backend: Backend = "auto",
                  event_bound: Optional[tuple[int, int]] = None) -> TimeMatching:
    """Detection matching (key = category and detail), then pairing (key = kind) over what is left, both by
    `greedy_match` on the absolute times `unwrap_ns` from each row's origin (``origin_ns`` [B]; a negative
    one, or None, is the row's first valid target event). A sweep (``tolerance_ns`` a tuple) runs the detection
    matching at each of its tolerances (`_sweep_match`); the first one's matches are the detection and the pairs.
    ``event_bound``: the most events of a row of each side (host ints, `EventBatch.event_bound`): the rows are the
    matchings' `Lanes` (`row_lanes`), no host sync; None (or rows too long): deferred acceptance, whose edges and rounds
    are read."""
    sweep = tolerance_ns if isinstance(tolerance_ns, tuple) else ()
    device = target.status.device
    t_ok, p_ok = target.status == int(Status.VALID), pred.status == int(Status.VALID)
    target_seq, pred_seq = (x if x.dtype == torch.long else x.long() for x in (target_seq, pred_seq))
    N, M = len(t_ok), len(p_ok)
    first_valid = torch.full((num_sequences,), N, dtype=torch.long, device=device).scatter_reduce(
        0, target_seq, torch.where(t_ok, torch.arange(N, device=device), N), "amin")
    origin = torch.cat([target.timestamp_ns, target.timestamp_ns.new_zeros(1)]).index_select(0, first_valid)
    if origin_ns is not None:
        origin = torch.where(origin_ns >= 0, origin_ns, origin)
    both_abs = unwrap_ns(torch.cat([target_seq, pred_seq + num_sequences]), torch.cat(
        [target.timestamp_ns, pred.timestamp_ns]), torch.cat([t_ok, p_ok]), origin.repeat(2), window_ns)
    t_abs, p_abs = both_abs.split([N, M])

    # every event of both sides, fixed shapes (no host read): an event that takes no part (invalid; for the pairing
    # by kind, detected or used) gets a key of its own (negative, distinct), which meets nothing
    own = torch.arange(N + M, device=device).neg_().sub_(1)
    t_key = torch.where(t_ok, detection_key(target_seq, target), own[:N])
    p_key = torch.where(p_ok, detection_key(pred_seq, pred), own[N:])
    lanes = row_lanes(t_abs, target_seq, num_sequences, event_bound, max(sweep or [tolerance_ns]), len(sweep) or 1)
    if sweep:
        detections = _sweep_match(t_key, t_abs, p_key, p_abs, sweep, backend, lanes)
        found, tolerance_ns = detections[0], sweep[0]
    else:
        found = greedy_match(t_key, t_abs, p_key, p_abs, tolerance_ns, backend, lanes)
    detection = detections[0].clone() if sweep else found
    used = _marked(detection, M)
    kind_key = lambda seq, side: seq * _ROW_SHIFT + side.kind  # noqa: E731
    by_kind = greedy_match(torch.where(t_ok & (found < 0), kind_key(target_seq, target), own[:N]), t_abs,
                           torch.where(p_ok & ~used, kind_key(pred_seq, pred), own[N:]), p_abs, tolerance_ns, backend,
                           lanes)
    paired = torch.where(by_kind >= 0, by_kind, detection)

    swept = _detection_counts(target, pred, t_ok, detections if sweep else detection[None])
    # generated event j is both_abs[N + j]; a missed target (-1) reads the last target's, masked: in range even when
    # the batch generated no event (M = 0)
    matched_ns = both_abs.index_select(0, detection + N)
    error_ms = torch.where(detection >= 0, (matched_ns - t_abs).abs().double() / 1e6, float("nan"))
    in_pair = _marked(paired, len(p_ok))
    return TimeMatching(detection=detection, paired=paired, detection_counts=swept[0], detection_error_ms=error_ms,
                        extra_events=(p_ok & ~in_pair).sum(), invalid_pred_events=(~p_ok).sum(), target_ns=t_abs,
                        generated_ns=p_abs, tolerance_ns=tolerance_ns, sweep_ns=sweep,
                        sweep_counts=swept if sweep else None, origin_ns=origin,
                        sweep_detection=detections if sweep else None)


def _sweep_match(t_key: torch.Tensor, t_ns: torch.Tensor, p_key: torch.Tensor, p_ns: torch.Tensor,
                 sweep: tuple[int, ...], backend: Backend, lanes: Optional[Lanes] = None) -> torch.Tensor:
    """[len(sweep), n_t]: `greedy_match` at each tolerance of ``sweep``, in one call: S copies of both sides, each
    copy's keys its own (key x S + copy), so that no copy meets another's and each one's matches are those of a
    match at its tolerance alone (each copy's ``lanes`` its own). Candidate indices of the original side (-1: none)."""
    S, n_t, n_p = len(sweep), len(t_key), len(p_key)
    copy = torch.arange(S, device=t_key.device)[:, None]
    group = _dense_rank(torch.cat([t_key, p_key])) * S
    tolerance = _on_device(sweep, t_key.device)[:, None].expand(S, n_t).reshape(-1)
    if lanes is not None:  # each copy's lanes its own: [depth, S x lanes]
        table = lanes.table.view(-1, 1, lanes.lanes)
        table = torch.where(table < n_t, table + copy.view(1, S, 1) * n_t, S * n_t)
        lanes = lanes._replace(table=table.view(-1), lanes=lanes.lanes * S)
    found = greedy_match((group[:n_t] + copy).view(-1), t_ns.repeat(S), (group[n_t:] + copy).view(-1),
                         p_ns.repeat(S), tolerance, backend, lanes).view(S, n_t)
    return torch.where(found >= 0, found - copy * n_p, -1)


def _detection_counts(target: EventFields, pred: EventFields, t_ok: torch.Tensor, detection: torch.Tensor,
                      t_group: Optional[torch.Tensor] = None, p_group: Optional[torch.Tensor] = None, groups: int = 1
                      ) -> torch.Tensor:
    """[S, 3, N_CAT + 1]: TP, FP, FN by category of S detection matchings (``detection`` [S, target events]):
    matched targets, generated events left over (an invalid one has category INVALID, column N_CAT: FP of no
    category), valid targets left over; one index_add_ (a CUDA bincount reads its range). With the group of each
    target and generated event (``t_group``, ``p_group``: in [0, groups)), by group: [groups, S, 3, N_CAT + 1]."""
    S, n_p, width = detection.shape[0], len(pred.status), N_CAT + 1
    matched = detection >= 0
    used = torch.zeros((S, n_p + 1), dtype=torch.bool, device=detection.device).scatter_(
        1, torch.where(matched, detection, n_p), True)[:, :n_p]
    base = torch.arange(S, device=detection.device)[:, None] * (3 * width)
    t_cell, p_cell = target.category, pred.category
    if t_group is not None:  # each group's block of S x 3 x width
        t_cell, p_cell = t_cell + t_group * (S * 3 * width), p_cell + p_group * (S * 3 * width)
    cells = torch.cat([t_cell + base, p_cell + (width + base), t_cell + (2 * width + base)], 1)
    counts = torch.zeros(groups * S * 3 * width, dtype=torch.float64, device=detection.device).index_add_(
        0, cells.view(-1), torch.cat([matched, ~used, t_ok & ~matched], 1).double().view(-1))
    return counts.view(S, 3, width) if t_group is None else counts.view(groups, S, 3, width)


def pair_by_time(true_batch: EventBatch, gen_batch: EventBatch, window_ns: int, tolerance_ns: Union[int, tuple],
                 origin_ns: Union[None, int, torch.Tensor] = None, backend: Backend = "auto") -> EventBatch:
    """``pairing="time"``: the true and the generated events, each side's every event span decoded on its own
    (the target sides: ``true_batch.target``, ``gen_batch.target``), -> an `EventBatch` (one row per target event,
    paired by `match_by_time`, its `TimeMatching` attached)."""
    B = true_batch.num_sequences
    true, gen = true_batch.target, gen_batch.target
    if origin_ns is not None:  # one number: a fill on the device (no copy from the host)
        device = true_batch.seq_idx.device
        origin_ns = torch.full((1,), origin_ns, dtype=torch.long, device=device) if isinstance(origin_ns, int) else \
            torch.as_tensor(origin_ns, dtype=torch.long, device=device)
        if origin_ns.dim() > 1 or origin_ns.numel() not in (1, B):
            raise ValueError(f"origin_ns must be one timestamp (ns) or one per sequence [{B}], got shape "
                             f"{tuple(origin_ns.shape)}")
        origin_ns = origin_ns.reshape(-1).expand(B)
    found = match_by_time(true, true_batch.seq_idx, gen, gen_batch.seq_idx, B, window_ns, tolerance_ns, origin_ns,
                          backend, true_batch.event_bound)
    pred = _with_blank_row(gen).take(torch.where(found.paired >= 0, found.paired, len(gen.status)))
    status = torch.where(true.status != int(Status.VALID), int(Status.INVALID_TARGET),
                         torch.where((pred.status == int(Status.VALID)) & (pred.kind != true.kind),
                                     int(Status.TYPE_MISMATCH), pred.status))
    return EventBatch(seq_idx=true_batch.seq_idx, status=status, target=true, pred=pred,
                      target_count=true_batch.target_count, pred_count=gen_batch.target_count, num_sequences=B,
                      alignment="generation", time_matching=found, generated=gen, generated_seq=gen_batch.seq_idx,
                      keyboard_bound=true_batch.keyboard_bound)


def _marked(match: torch.Tensor, n: int) -> torch.Tensor:
    """[n] bool: the candidates some entry of ``match`` (-1: none) points at (fixed shapes: no host sync)."""
    slots = torch.zeros(n + 1, dtype=torch.bool, device=match.device)
    return slots.index_fill_(0, torch.where(match >= 0, match, n), True)[:n]


def _with_blank_row(side: EventFields) -> EventFields:
    """``side`` plus one last row of a missing event (status MISSING, category INVALID, digits -1, span -1)."""
    values = torch.cat([side.values, side.values.new_zeros((1, side.values.shape[1]))])
    values[-1, 0].fill_(int(Category.INVALID))  # a fill, not a copy from the host
    extend = lambda x, fill: torch.cat([x, x.new_full((1, *x.shape[1:]), fill)])  # noqa: E731
    return replace(side, status=extend(side.status, int(Status.MISSING)), kind=extend(side.kind, -1), values=values,
                   digits=extend(side.digits, -1), start=extend(side.start, -1), end=extend(side.end, -1),
                   start_cut=extend(side.start_cut, False))
