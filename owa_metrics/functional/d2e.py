"""The D2E protocol (the D2E paper's ``evaluate.py``): binned mouse, button and key metrics, as sums that add up.

For each sequence (an MCAP pair, or a token sequence and its prediction) a range [start, end) on one time axis is
cut into bins of ``bin_ns`` from start (the last one ends at end, shorter); an event at or after end is dropped.
Per bin and side: the sums of (dx, dy) of the mouse events with ``button_flags == 0`` and whether there is one; the
counts of each button name (left / right / middle down / up bits of ``button_flags``) and of each key name
(``(event_type, vk)``). `d2e_states` turns both sides' events into one row of sums per shift (`STATES`: integers
in float64, exact below 2**53; they add across batches, files and ranks); `d2e_keys` turns the rows into keys:

- ``pearson_{x,y}``: Pearson's r of the true and predicted per-bin sums over the bins where either side has a move
  (from n, Σt, Σp, Σt², Σp², Σtp, exactly: (nΣtp - ΣtΣp) / sqrt((nΣt² - (Σt)²)(nΣp² - (Σp)²)); none below 2
  bins or with a constant side); ``scale_ratio_{x,y}``: Σ|t| / Σ|p| over ALL bins (the ratio of the mean |sums|), inverted
  when below 1 (none when Σ|p| = 0; inf when Σ|t| = 0 < Σ|p|, as upstream's numpy gives); ``sample_count``: n.
- ``button_accuracy`` / ``key_accuracy``: over every (bin, name) seen on either side, 1 if the counts are equal;
  a bin with no name on either side adds a right value with ``empty_bins_as_correct``, else nothing.
- shift k (`d2e_states`' ``shifts``): true bin i against predicted bin i + k, over the bins where both exist (a
  sequence of n bins gives n - |k| pairs): a prediction late by k bins scores best at shift +k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

STATES = ("num_bins", "duration_ns", "move_bins",
          "sum_tx", "sum_px", "sum_tx2", "sum_px2", "sum_txpx",
          "sum_ty", "sum_py", "sum_ty2", "sum_py2", "sum_typy",
          "abs_tx", "abs_px", "abs_ty", "abs_py",
          "button_right", "button_values", "button_empty_bins", "key_right", "key_values", "key_empty_bins")
S = {name: i for i, name in enumerate(STATES)}
# RawMouseEvent.ButtonFlags: left, right, middle (down, up); the names upstream counts
BUTTONS = (("left_down", 0x001), ("left_up", 0x002), ("right_down", 0x004), ("right_up", 0x008),
           ("middle_down", 0x010), ("middle_up", 0x020))
_BUTTON_BITS = torch.tensor([bit for _, bit in BUTTONS])
_KEY_NAMES = 1 << 20  # key name codes (vk * 2 + action) below this: one int64 (bin, name) key
KEY_PREFIX = "d2e"


@dataclass
class D2EEvents:
    """One side's events of B sequences (int64 [n] each): keyboard (its sequence, time in ns on the sequence's axis,
    ``vk * 2 + action``, action 0 press / 1 release) and raw mouse (sequence, time, dx, dy, button_flags)."""

    key_seq: torch.Tensor
    key_ns: torch.Tensor
    key_code: torch.Tensor
    mouse_seq: torch.Tensor
    mouse_ns: torch.Tensor
    dx: torch.Tensor
    dy: torch.Tensor
    button_flags: torch.Tensor

    @classmethod
    def of(cls, key_ns, vk, action, mouse_ns, dx, dy, button_flags, key_seq=None, mouse_seq=None,
           device=None) -> "D2EEvents":
        """From arrays (numpy or torch; one sequence when ``*_seq`` is None)."""
        t = lambda x: torch.as_tensor(x, dtype=torch.long, device=device).reshape(-1)  # noqa: E731
        key_ns, mouse_ns = t(key_ns), t(mouse_ns)
        return cls(t(key_seq) if key_seq is not None else torch.zeros_like(key_ns), key_ns, t(vk) * 2 + t(action),
                   t(mouse_seq) if mouse_seq is not None else torch.zeros_like(mouse_ns), mouse_ns, t(dx), t(dy),
                   t(button_flags))


def shift_rows(bin_shifts: Sequence[int] = ()) -> tuple[int, ...]:
    """The shifts a state holds rows for: 0 and ``bin_shifts``, ascending."""
    return tuple(sorted({0, *(int(k) for k in bin_shifts)}))


def bin_ns_of(bin_ms: float) -> int:
    """A bin width in ms as whole ns (> 0), checked."""
    if isinstance(bin_ms, bool) or not isinstance(bin_ms, (int, float)) or not math.isfinite(bin_ms) or \
            round(float(bin_ms) * 1_000_000) <= 0:
        raise ValueError(f"bin_ms must be a positive number of milliseconds (upstream's D2E protocol: 50), got "
                         f"{bin_ms!r}")
    return round(float(bin_ms) * 1_000_000)


def num_bins(start_ns: torch.Tensor, end_ns: torch.Tensor, bin_ns: int) -> torch.Tensor:
    """Bins of each range: ceil((end - start) / bin_ns), 0 where end <= start."""
    return torch.div((end_ns - start_ns).clamp(min=0) + bin_ns - 1, bin_ns, rounding_mode="floor")


def d2e_states(truth: D2EEvents, pred: D2EEvents, start_ns: torch.Tensor, end_ns: torch.Tensor, bin_ns: int,
               shifts: Sequence[int] = (0,), group: Optional[torch.Tensor] = None, groups: int = 1) -> torch.Tensor:
    """[len(shifts), len(STATES)] float64: the sums of `STATES` over B sequences with ranges [start_ns, end_ns) [B]
    (a range with end <= start has no bins), comparing true bin i with predicted bin i + k at each shift k. Torch
    ops on the events' device; the numbers of bins and of distinct (bin, name) keys are read on the host. ``group``
    [B]: each sequence's group in [0, groups) (a tag): the sums by group, [groups, len(shifts), len(STATES)], in the
    same pass (each bin's sums scattered to its sequence's group)."""
    device = start_ns.device
    grouped, group = group is not None, (group if group is not None else torch.zeros_like(start_ns)).long()
    start_ns, end_ns = start_ns.long(), end_ns.long()
    nb = num_bins(start_ns, end_ns, bin_ns)
    offsets = nb.cumsum(0) - nb
    total = int(nb.sum())
    duration = torch.zeros(groups, dtype=torch.float64, device=device).index_add_(
        0, group, (end_ns - start_ns).clamp(min=0).double())
    bin_seq = torch.repeat_interleave(torch.arange(len(nb), device=device), nb)
    bin_group = group.index_select(0, bin_seq)
    by_group = (bin_group == torch.arange(groups, device=device)[:, None]).double()  # [groups, bins]
    bin_local = torch.arange(total, device=device) - offsets.index_select(0, bin_seq)
    bin_count = nb.index_select(0, bin_seq)

    per_seq = torch.stack([start_ns, end_ns, offsets, nb], 1)

    def place(seq, t):  # each event's global bin (-1: outside its range), its bin in its sequence, its bins
        start, end, offset, count = per_seq.index_select(0, seq).unbind(1)
        local = torch.div(t - start, bin_ns, rounding_mode="floor")
        return torch.where((t >= start) & (t < end), offset + local, -1), local, count

    sides = []
    for ev in (truth, pred):
        g, local, count = place(ev.mouse_seq, ev.mouse_ns)
        at = torch.where((g >= 0) & (ev.button_flags == 0), g, total)  # a spare last bin takes what is not a move
        sums = torch.stack([torch.bincount(at, ev.dx.double(), total + 1), torch.bincount(at, ev.dy.double(), total + 1)],
                           1)[:total].double()  # integers, exact in float64 (no event: bincount gives int64)
        has = torch.bincount(at, minlength=total + 1)[:total] > 0
        kg, klocal, kcount = place(ev.key_seq, ev.key_ns)
        bits = ((ev.button_flags[:, None] & _BUTTON_BITS.to(device)) != 0) & (g >= 0)[:, None]
        b_event, b_name = bits.nonzero(as_tuple=True)
        sides.append(dict(sums=sums, has=has,
                          keys=(kg, klocal, kcount, ev.key_code, _KEY_NAMES),
                          buttons=(g.index_select(0, b_event), local.index_select(0, b_event),
                                   count.index_select(0, b_event), b_name, len(BUTTONS))))
    rows = []
    for k in shifts:
        k = int(k)
        valid = (bin_local + k >= 0) & (bin_local + k < bin_count)  # true bins with a predicted bin k later
        if k:
            later = (torch.arange(total, device=device) + k).clamp(0, max(total - 1, 0))  # valid: the same sequence
            p, p_has = sides[1]["sums"].index_select(0, later), sides[1]["has"].index_select(0, later)
        else:
            p, p_has = sides[1]["sums"], sides[1]["has"]
        t = sides[0]["sums"]
        pearson = (valid & (sides[0]["has"] | p_has)).double()
        # over the Pearson bins: tx ty px py, their squares, tx px, ty py; over every compared bin: |tx| |ty| |px| |py|
        moves = (by_group * pearson) @ torch.cat([t, p, t * t, p * p, t * p], 1)  # [groups, 10]
        absolute = (by_group * valid) @ torch.cat([t, p], 1).abs()
        n_valid = by_group @ valid.double()
        counts = [_count_agreement(sides[0][kind], sides[1][kind], k, n_valid, bin_group, groups)
                  for kind in ("buttons", "keys")]
        x, y = moves.view(groups, 5, 2).unbind(2)  # per axis: Σt, Σp, Σt², Σp², Σtp
        head = torch.stack([n_valid, duration, by_group @ pearson], 1)
        rows.append(torch.cat([head, x, y, absolute[:, [0, 2, 1, 3]], torch.stack([*counts[0], *counts[1]], 1)], 1))
    out = torch.stack(rows, 1)  # integers in float64: exact whatever the order of the sums
    return out if grouped else out[0]


def _count_agreement(truth: tuple, pred: tuple, k: int, n_valid: torch.Tensor, bin_group: torch.Tensor,
                     groups: int) -> list[torch.Tensor]:
    """(right, values, empty bins) [groups] of one kind of names at shift k: over the distinct (true bin, name) keys
    of both sides, right where the two counts are equal; the compared bins with no key; each by the group of the
    true bin's sequence (``bin_group``)."""
    keys, sides = [], []
    for side, (g, local, count, name, n_names) in enumerate((truth, pred)):
        moved = k if side else -k  # a predicted event in bin j compares in true bin j - k; a true bin i needs i + k
        keep = (g >= 0) & (local - moved >= 0) & (local - moved < count)
        true_bin = g - k if side else g
        keys.append((true_bin * n_names + name)[keep])
        sides.append(torch.full_like(keys[-1], side))
    n_names = truth[4]
    both = torch.cat(keys)
    distinct, inverse = torch.unique(both, return_inverse=True)
    side = torch.cat(sides)
    per = torch.zeros((len(distinct), 2), dtype=torch.long, device=both.device).index_put_(
        (inverse, side), torch.ones_like(side), accumulate=True)
    key_group = bin_group.index_select(0, torch.div(distinct, n_names, rounding_mode="floor"))
    named_bins = torch.unique(torch.div(distinct, n_names, rounding_mode="floor"))
    sums = torch.zeros((3, groups), dtype=torch.float64, device=both.device)
    sums[0].index_add_(0, key_group, (per[:, 0] == per[:, 1]).double())
    sums[1].index_add_(0, key_group, torch.ones_like(key_group, dtype=torch.float64))
    sums[2].index_add_(0, bin_group.index_select(0, named_bins), torch.ones_like(named_bins, dtype=torch.float64))
    return [sums[0], sums[1], n_valid - sums[2]]


def d2e_keys(states: torch.Tensor, empty_bins_as_correct: bool = False, shifts: Sequence[int] = (0,),
             prefix: str = KEY_PREFIX) -> dict[str, float]:
    """The keys of `d2e_states`' rows (one per shift of ``shifts``; the plain keys from shift 0): ``d2e/num_bins``,
    ``d2e/duration_s``, ``d2e/mouse_move/{pearson_x, pearson_y, scale_ratio_x, scale_ratio_y, sample_count}``,
    ``d2e/mouse_button/{button_accuracy, sample_count}``, ``d2e/keyboard/{key_accuracy, sample_count}``; a value
    upstream reports as none is left out. With shifts other than 0: every key but the duration at each shift k as
    ``...@{k:+d}bins``, and ``d2e/best_shift_bins`` (`best_shift`)."""
    shifts = [int(k) for k in shifts]
    rows = [[float(v) for v in row] for row in states.double().cpu()]
    by_shift = {k: _row_keys(row, empty_bins_as_correct) for k, row in zip(shifts, rows)}
    out = {"num_bins": rows[shifts.index(0)][S["num_bins"]], "duration_s": rows[shifts.index(0)][S["duration_ns"]] / 1e9}
    out.update(by_shift[0])
    if shifts != [0]:
        for k, keys in by_shift.items():
            out.update({f"{name}@{k:+d}bins": v for name, v in keys.items()})
        best = best_shift(by_shift)
        if best is not None:
            out["best_shift_bins"] = float(best)
    return {f"{prefix}/{name}": v for name, v in out.items()}


def _row_keys(row: list[float], empty_bins_as_correct: bool) -> dict[str, float]:
    """One row's keys (without the ``d2e/`` prefix); ``num_bins``: the bins compared."""
    v = {name: int(row[i]) for name, i in S.items() if name != "duration_ns"}  # integers: exact below 2**53
    out = {}
    n = v["move_bins"]
    for axis in ("x", "y"):
        st, sp, st2, sp2, stp = (v[f"sum_{name}"] for name in (f"t{axis}", f"p{axis}", f"t{axis}2", f"p{axis}2",
                                                                  f"t{axis}p{axis}"))
        var_t, var_p = n * st2 - st * st, n * sp2 - sp * sp
        if n >= 2 and var_t > 0 and var_p > 0:
            r = (n * stp - st * sp) / (math.sqrt(var_t) * math.sqrt(var_p))
            out[f"mouse_move/pearson_{axis}"] = max(-1.0, min(1.0, r))
        abs_t, abs_p = v[f"abs_t{axis}"], v[f"abs_p{axis}"]
        if abs_p > 0:
            out[f"mouse_move/scale_ratio_{axis}"] = (abs_t / abs_p if abs_t >= abs_p else
                                                      abs_p / abs_t if abs_t > 0 else math.inf)
    out["mouse_move/sample_count"] = float(n)
    for kind, name in (("button", "mouse_button/button_accuracy"), ("key", "keyboard/key_accuracy")):
        extra = v[f"{kind}_empty_bins"] if empty_bins_as_correct else 0
        right, values = v[f"{kind}_right"] + extra, v[f"{kind}_values"] + extra
        if values:
            out[name] = right / values
        out[name.split("/")[0] + "/sample_count"] = float(values)
    out["num_bins"] = float(v["num_bins"])
    return out


BEST_SHIFT_SCORES = ("keyboard/key_accuracy", "mouse_button/button_accuracy", "mouse_move/pearson")


def best_shift(by_shift: dict[int, dict[str, float]]) -> Optional[int]:
    """The shift with the highest mean of the key accuracy, the button accuracy and the mouse Pearson r (the mean of
    x and y; each of the three where defined); ties: the smallest |k|, then the smallest k. None when no shift has
    any of them."""
    scores = {}
    for k, keys in by_shift.items():
        pearson = [keys[f"mouse_move/pearson_{a}"] for a in ("x", "y") if f"mouse_move/pearson_{a}" in keys]
        parts = [keys[n] for n in BEST_SHIFT_SCORES[:2] if n in keys] + ([sum(pearson) / len(pearson)] if pearson else [])
        if parts:
            scores[k] = sum(parts) / len(parts)
    if not scores:
        return None
    return min(scores, key=lambda k: (-scores[k], abs(k), k))


# ------------------------------------------------------------------------------------------ decoded token sequences
def batch_events(batch, window_ns: int) -> tuple[D2EEvents, D2EEvents, torch.Tensor, torch.Tensor]:
    """``(truth, pred, start_ns, end_ns)`` of a decoded `EventBatch`: each side's valid keyboard and mouse events on
    the row's time axis, and each row's range.

    Times: with time pairing, the matching's absolute times (from the row's origin); otherwise the target's
    timestamps unwrapped along the row from its first valid target event (`unwrap_ns`), the generated ones likewise
    (generation), and under teacher forcing each prediction at its target's time plus the wrapped difference of
    the two timestamps (in [-W/2, W/2); a prediction whose target does not decode has no time and is left out).
    Range: [the row's origin (time pairing) or its first valid target event, its last valid target event]; as
    upstream's end_time (the last message), the last event closes the range and falls outside it. A row with
    fewer than two target times has no bins.
    """
    from ..decode.matching import unwrap_ns
    from ..schema import Category, Status

    t, seq, B = batch.target, batch.seq_idx.long(), batch.num_sequences
    t_ok = t.status == int(Status.VALID)
    tm = batch.time_matching
    first = torch.full((B,), len(t_ok), dtype=torch.long, device=seq.device).scatter_reduce(
        0, seq, torch.where(t_ok, torch.arange(len(t_ok), device=seq.device), len(t_ok)), "amin")
    origin = torch.cat([t.timestamp_ns, t.timestamp_ns.new_zeros(1)]).index_select(0, first)
    if tm is not None:
        t_ns, origin = tm.target_ns, tm.origin_ns
    else:
        t_ns = unwrap_ns(seq, t.timestamp_ns, t_ok, origin, window_ns)
    if batch.generated is not None:
        p, p_seq = batch.generated, batch.generated_seq.long()
        p_ok = p.status == int(Status.VALID)
        p_ns = tm.generated_ns if tm is not None else unwrap_ns(p_seq, p.timestamp_ns, p_ok, origin, window_ns)
    else:  # teacher forcing: one prediction per target row
        p, p_seq = batch.pred, seq
        p_ok = (p.status == int(Status.VALID)) & t_ok
        half = window_ns // 2
        p_ns = t_ns + torch.remainder(p.timestamp_ns - t.timestamp_ns + half, window_ns) - half
    low, high = torch.iinfo(torch.long).min, torch.iinfo(torch.long).max
    start = torch.full((B,), high, dtype=torch.long, device=seq.device).scatter_reduce(
        0, seq, torch.where(t_ok, t_ns, high), "amin")
    end = torch.full((B,), low, dtype=torch.long, device=seq.device).scatter_reduce(
        0, seq, torch.where(t_ok, t_ns, low), "amax")
    if tm is not None:
        start = torch.where(end > low, origin, start)
    start, end = torch.where(end > low, start, 0), torch.where(end > low, end, 0)  # no valid target: no bins
    sides = []
    for f, s, ok, ns in ((t, seq, t_ok, t_ns), (p, p_seq, p_ok, p_ns)):
        key = (ok & (f.category == int(Category.KEYBOARD))).nonzero().squeeze(1)
        mouse = (ok & ((f.category == int(Category.MOUSE_OP)) | (f.category == int(Category.MOUSE_NOP)))).nonzero(
        ).squeeze(1)
        pick = lambda x, at: x.index_select(0, at).long()  # noqa: E731
        sides.append(D2EEvents(pick(s, key), pick(ns, key), pick(f.vk * 2 + f.action, key), pick(s, mouse),
                               pick(ns, mouse), pick(f.dx, mouse), pick(f.dy, mouse), pick(f.button_flags, mouse)))
    return sides[0], sides[1], start, end


def batch_states(batch, window_ns: int, bin_ms: float, bin_shifts: Sequence[int] = (),
                 group: Optional[torch.Tensor] = None, groups: int = 1) -> torch.Tensor:
    """`d2e_states` of a decoded batch's rows (`batch_events`), one row per shift of `shift_rows` (by group of
    sequences with ``group``)."""
    truth, pred, start, end = batch_events(batch, window_ns)
    return d2e_states(truth, pred, start, end, bin_ns_of(bin_ms), shift_rows(bin_shifts), group, groups)
