"""The D2E protocol (the D2E paper's ``evaluate.py``): binned mouse, button and key metrics, as sums that add up.

For each sequence (an MCAP pair, or a token sequence and its prediction) a range [start, end) on one time axis is
cut into bins of ``bin_ns`` from start (the last one ends at end, shorter); an event at or after end is dropped.
Per bin and side: the sums of (dx, dy) of the mouse events with ``button_flags == 0`` and whether there is one; the
counts of each button name (left / right / middle down / up bits of ``button_flags``) and of each key name
(``(event_type, vk)``). `d2e_states` turns both sides' events into one row of sums per shift (`STATES`: integers
in float64 that add across batches, files and ranks: the counts, and the moments as `MOMENTS`' limbs, exact for
any int64 per-bin sums up to 2**31 bins in all); `d2e_keys` turns the rows into keys:

- ``pearson_{x,y}``: Pearson's r of the true and predicted per-bin sums over the bins where either side has a move
  (upstream's script; from n, Σt, Σp, Σt², Σp², Σtp as Python integers: c = nΣtp - ΣtΣp, v = nΣt² - (Σt)², r =
  sign(c) sqrt(c² / (v_t v_p)), one rounding; none below 2 bins or with a constant side); ``pearson_{x,y}_all_bins``:
  the same over every bin compared (the paper's reading, issue 46: n = ``num_bins``); ``scale_ratio_{x,y}``: Σ|t| / Σ|p|
  over ALL bins (the ratio of the mean |sums|), inverted when below 1 (none when Σ|p| = 0; inf when Σ|t| = 0 < Σ|p|,
  as upstream's numpy gives); ``sample_count``: n.
- ``button_accuracy`` / ``key_accuracy``: over every (bin, name) seen on either side, 1 if the counts are equal;
  a bin with no name on either side adds a right value with ``empty_bins_as_correct``, else nothing.
- the community's per-bin keys (`_strict_keys`): a bin alike when every name's counts are equal; keyboard
  ``strict_accuracy`` over the bins with a true key; button ``precision`` / ``recall`` / ``f1`` over bins; each
  kind's ``false_positive_rate`` over the bins without a true event.
- shift k (`d2e_states`' ``shifts``): true bin i against predicted bin i + k, over the bins where both exist (a
  sequence of n bins gives n - |k| pairs): a prediction late by k bins scores best at shift +k.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..decode.event_batch import VALUE_COLUMNS
from ..decode.kernel import KEYBOARD_CAT, MOUSE_NOP_CAT, MOUSE_OP_CAT, VALID, _jit
from ..decode.kernel import available as kernel_available
from ..decode.matching import STEP_BACK_NS

COUNTS = ("num_bins", "duration_ns", "move_bins", "button_right", "button_values", "button_empty_bins", "key_right",
          "key_values", "key_empty_bins", "key_true_bins", "key_exact_bins", "button_true_bins", "button_pred_bins",
          "button_exact_bins")
# the Pearson and scale moments, each held exactly as limbs of base 2**21 (`DIGIT_BITS`): 3 for a sum of per-bin
# sums (|x| < 2**63; `_digits`), 6 for a sum of their products (`_product_limbs`); a bin adds at most 2**21 + 4 to a
# limb, so the float64 sums stay exact up to 2**31 bins
MOMENTS = {**{f"{kind}_{side}{axis}": 3 for axis in "xy" for kind in ("sum", "abs") for side in "tp"},
           **{f"sum_{name}": 6 for axis in "xy" for name in (f"t{axis}2", f"p{axis}2", f"t{axis}p{axis}")}}
STATES = (*COUNTS, *(f"{name}.{j}" for name, n in MOMENTS.items() for j in range(n)))
S = {name: i for i, name in enumerate(STATES)}
DIGIT_BITS = 21
_MASK = (1 << DIGIT_BITS) - 1
# RawMouseEvent.ButtonFlags: left, right, middle (down, up); the names upstream counts (bit i of button_flags)
BUTTONS = (("left_down", 0x001), ("left_up", 0x002), ("right_down", 0x004), ("right_up", 0x008),
           ("middle_down", 0x010), ("middle_up", 0x020))
_NAME_BITS = 20  # key name codes (vk * 2 + action) + 1 below 2**20, bins below 2**42: one int64 key per event
_NAMES = 1 << _NAME_BITS
_N_BUTTONS = len(BUTTONS)  # the compiled loop's: button name i is bit i
_NO_RUN = torch.iinfo(torch.long).max  # the sort key of an event that counts nowhere, and of the runs past the last
KEY_PREFIX = "d2e"
DEFAULT_BIN_MS = 50  # upstream's bins and the paper's: `OWAEventMetrics`' default in generation


@dataclass
class D2EEvents:
    """One side's events of B sequences ([n] each): the sequence, the time in ns on the sequence's axis, whether it
    is a keyboard event (else raw mouse), ``vk * 2 + action`` (keyboard; action 0 press / 1 release), dx, dy and
    button_flags (mouse), and whether it counts (one that does not is ignored: fixed shapes, nothing selected)."""

    seq: torch.Tensor
    ns: torch.Tensor
    is_key: torch.Tensor
    key_code: torch.Tensor
    dx: torch.Tensor
    dy: torch.Tensor
    button_flags: torch.Tensor
    counts: torch.Tensor

    @classmethod
    def of(cls, key_ns, vk, action, mouse_ns, dx, dy, button_flags, key_seq=None, mouse_seq=None,
           device=None) -> "D2EEvents":
        """From arrays of keyboard and of mouse events (numpy or torch; one sequence when ``*_seq`` is None)."""
        t = lambda x: torch.as_tensor(x, dtype=torch.long, device=device).reshape(-1)  # noqa: E731
        key_ns, mouse_ns = t(key_ns), t(mouse_ns)
        seq = lambda s, ns: t(s) if s is not None else torch.zeros_like(ns)  # noqa: E731
        no_key, no_mouse = torch.zeros_like(mouse_ns), torch.zeros_like(key_ns)
        return cls(torch.cat([seq(key_seq, key_ns), seq(mouse_seq, mouse_ns)]), torch.cat([key_ns, mouse_ns]),
                   torch.cat([torch.ones_like(key_ns, dtype=torch.bool), torch.zeros_like(mouse_ns, dtype=torch.bool)]),
                   torch.cat([t(vk) * 2 + t(action), no_key]), torch.cat([no_mouse, t(dx)]),
                   torch.cat([no_mouse, t(dy)]), torch.cat([no_mouse, t(button_flags)]),
                   torch.ones(len(key_ns) + len(mouse_ns), dtype=torch.bool, device=key_ns.device))


def shift_rows(bin_shifts: Sequence[int] = ()) -> tuple[int, ...]:
    """The shifts a state holds rows for: 0 and ``bin_shifts``, ascending."""
    return tuple(sorted({0, *(int(k) for k in bin_shifts)}))


def bin_ns_of(bin_ms: float, name: str = "bin_ms") -> int:
    """A bin width in ms as whole ns, checked: 0 < ns < 2**63 (int64 nanoseconds); ``name``: the argument's, as the
    error names it."""
    ns = round(float(bin_ms) * 1_000_000) if isinstance(bin_ms, (int, float)) and not isinstance(bin_ms, bool) and \
        math.isfinite(bin_ms) else None
    if ns is None or not 0 < ns < 2**63:
        raise ValueError(f"{name} must be a positive number of milliseconds below {(2**63 - 1) / 1e6:.0f} (bins are "
                         f"whole int64 nanoseconds; upstream's D2E protocol: 50), got {bin_ms!r}")
    return ns


def num_bins(start_ns: torch.Tensor, end_ns: torch.Tensor, bin_ns: int) -> torch.Tensor:
    """Bins of each range: ceil((end - start) / bin_ns), 0 where end <= start (no int64 overflow for any bin_ns)."""
    span = end_ns - start_ns
    return torch.where(span > 0, torch.div(span - 1, bin_ns, rounding_mode="floor") + 1, 0)


def d2e_states(truth: D2EEvents, pred: D2EEvents, start_ns: torch.Tensor, end_ns: torch.Tensor, bin_ns: int,
               shifts: Sequence[int] = (0,), group: Optional[torch.Tensor] = None, groups: int = 1,
               compiled: bool = False) -> torch.Tensor:
    """[len(shifts), len(STATES)] float64: the sums of `STATES` over B sequences with ranges [start_ns, end_ns) [B]
    (a range with end <= start has no bins), comparing true bin i with predicted bin i + k at each shift k. ``group``
    [B]: each sequence's group in [0, groups) (a tag): the sums by group, [groups, len(shifts), len(STATES)], in the
    same pass.

    Torch ops on the events' device in shapes known without a read (the numbers of events, sequences, shifts and
    groups): no host sync. The bins of all sequences are numbered in a row; both sides' events are sorted by
    (bin, side, name) (name: 0 for a mouse event, its key name + 1 for a keyboard one), each run of one such key
    summed (`_VALUES`), and a true run of bin i meets the predicted run of bin i + k (same name) by a binary search.
    Bins below 2**42, key names (vk * 2 + action) below 2**20 - 1. ``compiled``: the same sums from one compiled loop
    over the events and bins (`_binned`; CPU tensors, numba), which reads sizes on the host: where a read costs
    nothing (the MCAP route, the compiled CPU path); the torch ops without numba."""
    if compiled and start_ns.device.type == "cpu" and kernel_available():
        return _compiled_states(truth, pred, start_ns, end_ns, bin_ns, shifts, group, groups)
    device = start_ns.device
    grouped, group = group is not None, (group if group is not None else torch.zeros_like(start_ns)).long()
    start_ns, end_ns = start_ns.long(), end_ns.long()
    ks, to_states = _constants(tuple(int(k) for k in shifts), device)
    nb = num_bins(start_ns, end_ns, bin_ns)
    offsets = nb.cumsum(0) - nb  # each sequence's first bin in the numbering of all bins
    in_group = (group == torch.arange(groups, device=device)[:, None]).double()  # [groups, B]
    per_seq = in_group @ torch.cat([(nb[:, None] - ks.abs()).clamp(min=0), (end_ns - start_ns).clamp(min=0)[:, None]],
                                   1).double()  # [groups, shifts + 1]: the bins compared at each shift, the duration
    parts = torch.zeros((len(ks), groups, len(_PARTS)), dtype=torch.float64, device=device)
    parts[..., -2:] = torch.stack([per_seq[:, :-1].T, per_seq[:, -1:].T.expand(len(ks), groups)], -1)
    if len(start_ns) == 0 or len(truth.ns) + len(pred.ns) == 0:
        return _by_state(parts, to_states, grouped)

    ev = D2EEvents(*(torch.cat([getattr(truth, f.name), getattr(pred, f.name)]) for f in fields(D2EEvents)))
    side = (torch.arange(len(ev.ns), device=device) >= len(truth.ns)).long()
    start, end, first_bin = torch.stack([start_ns, end_ns, offsets], 1).index_select(0, ev.seq).unbind(1)
    inside = ev.counts & (ev.ns >= start) & (ev.ns < end)
    at_bin = first_bin + torch.div(ev.ns - start, bin_ns, rounding_mode="floor")
    mouse, key = inside & ~ev.is_key, inside & ev.is_key
    move = mouse & (ev.button_flags == 0)
    bits = ((ev.button_flags[:, None] >> torch.arange(len(BUTTONS), device=device)) & 1) * mouse[:, None]
    keys, runs = _runs(torch.where(inside, (at_bin * 2 + side) * _NAMES + torch.where(ev.is_key, ev.key_code + 1, 0),
                                   _NO_RUN),
                       torch.cat([move[:, None], bits, bits.any(1, keepdim=True), key[:, None], torch.stack(
                           [ev.dx * move, ev.dy * move], 1)], 1))
    # each run: its side, sequence (whose bins hold its bin), place in the sequence, group and side; the first of
    # its bin and side among the key names' runs (the runs of one bin and side: the mouse's, then the names')
    real, name, bin_side = keys != _NO_RUN, keys & (_NAMES - 1), keys >> _NAME_BITS
    side, at_bin = bin_side & 1, bin_side >> 1
    seq = (torch.searchsorted(offsets, at_bin, right=True) - 1).clamp(min=0)
    local, count = at_bin - offsets.index_select(0, seq), nb.index_select(0, seq)
    run_group = (group.index_select(0, seq) * 2 + side == torch.arange(2 * groups, device=device)[:, None]).double()
    first_name = (name > 0) & real & ((bin_side != F.pad(bin_side[:-1], (1, 0), value=-1)) |
                                      (F.pad(name[:-1], (1, 0)) == 0))
    has, xy = (runs > 0)[:, :-2].double(), runs[:, -2:]  # [runs, 9]: a move, each button name, any, a key name
    limbs = _digits(torch.cat([xy, xy.abs()], 1))  # [3, runs, 4]: x, y, |x|, |y|
    each = torch.cat([has, runs[:, 1:-2].double(), first_name.double()[:, None], *(
        v.permute(1, 2, 0).reshape(len(keys), -1) for v in (limbs, _product_limbs(limbs[:, :, :2], limbs[:, :, :2])))],
        1)  # `_EACH`
    # each run's bin-side's first key-name run (its head) and, at a head, that bin-side's key names
    at = torch.arange(len(keys), device=device)
    head = torch.cummax(torch.where(first_name, at, 0), 0).values
    names = torch.zeros_like(keys).index_add_(0, head, (real & (name > 0)).long())
    n = len(keys)  # blocks of (shift, run) pairs of bounded size: one block at training sizes
    block = min(n, _PAIRS)
    per = max(1, _PAIRS // block)
    for s0 in range(0, len(ks), per):
        k = ks[s0:s0 + per, None]
        # at each true head: its key names with the same count on both sides, the prediction's key names in bin i + k
        right_names, pred_names = (torch.zeros((len(k), n), dtype=torch.long, device=device) for _ in range(2))
        for r0 in range(0, n, block):
            r = slice(r0, r0 + block)
            moved = local[r] + k * (1 - 2 * side[r])
            valid = real[r] & (moved >= 0) & (moved < count[r])
            true_valid = valid & (side[r] == 0)
            wanted = torch.where(true_valid, keys[r] + (2 * k + 1) * _NAMES, -1)
            met = torch.searchsorted(keys, wanted)  # < n: the last key is _NO_RUN
            found = true_valid & (keys.take(met) == wanted)
            # a true key name's first run of its bin i: does the prediction have a key name in bin i + k?
            first_wanted = torch.where(true_valid & first_name[r], (bin_side[r] + 2 * k + 1) * _NAMES + 1, -1)
            names_at = torch.searchsorted(keys, first_wanted)
            names_met = keys.take(names_at) >> _NAME_BITS == first_wanted >> _NAME_BITS
            flat, truth_group = met.flatten(), run_group[::2, r]
            met_found = found.double()[:, None] * truth_group  # [shifts, groups, runs]
            other = each[:, :17].index_select(0, flat).view(*met.shape, -1)  # the counts a met pair compares
            same = each[r, 9:17] == other[..., 9:17]  # each button name, any, the key name
            met_xy = limbs[:, :, :2].index_select(1, flat).view(3, *met.shape, 2)  # x', y' of the met runs
            products = _product_limbs(limbs[:, None, r, :2], met_xy).permute(1, 2, 3, 0).reshape(*met.shape, 12)
            parts[s0:s0 + per, :, :-3] += torch.cat([
                ((valid.double()[:, None] * run_group[:, r]) @ each[r]).view(len(k), groups, -1),
                met_found @ (each[r, :9] * other[..., :9]),
                met_found @ (same * has[r, 1:]),
                (names_met.double()[:, None] * truth_group).sum(-1, keepdim=True),
                met_found @ products,
                met_found @ (same[..., :6].all(-1, keepdim=True) * has[r, 7:8])], -1)
            right_names.index_add_(1, head[r], (found & same[..., 7] & (name[r] > 0)).long())
            pred_names[:, r] = torch.where(names_met, names.take(names_at), -1)  # -1: not a valid true head
        exact = (pred_names == names) & (right_names == names)  # a true head: its bin's names all alike
        parts[s0:s0 + per, :, -3] += (exact.double()[:, None] * run_group[::2, :n]).sum(-1)
    return _by_state(parts, to_states, grouped)


def _by_state(parts: torch.Tensor, to_states: torch.Tensor, grouped: bool) -> torch.Tensor:
    out = (parts @ to_states).transpose(0, 1)  # integers in float64: exact whatever the order of the sums
    return out if grouped else out[0]


# the values summed over a run of (bin, side, name) (integers): its moves, its count of each button name and of
# events with any (mouse: name 0), its keyboard events (a key name's run), dx and dy of its moves
_VALUES = ("move", *(name for name, _ in BUTTONS), "button", "name", "dx", "dy")
_LIMBS = lambda name, n: tuple(f"{name}.{j}" for j in range(n))  # noqa: E731
# a valid run's columns (by side: name_t, name_p): whether it has each of `_VALUES` but x, y; its counts (unused; a
# met pair compares them); the first key name's run of its bin and side (its bin has a key name); the limbs of x, y,
# |x|, |y|, x², y²
_EACH = (*(f"has_{name}" for name in _VALUES[:-2]), *(f"n_{name}" for name in _VALUES[1:-2]), "key",
         *_LIMBS("dx", 3), *_LIMBS("dy", 3), *_LIMBS("adx", 3), *_LIMBS("ady", 3), *_LIMBS("dx2", 6), *_LIMBS("dy2", 6))
# a valid true run's that met a predicted one (same bin + k and name): both have each of `_VALUES` but x, y; the
# same count of each (one of them unused: any button); the prediction has a key name in bin i + k where this run is
# its bin's first key name; the limbs of the products x x', y y'; the true bin has a button name and each name's
# count equal; (its bin's first key name) the true bin has a key name and each name's count equal
_BOTH = (*(f"both_{name}" for name in _VALUES[:-2]), *(f"same_{name}" for name in _VALUES[1:-2]), "both_key",
         *_LIMBS("dxdx", 6), *_LIMBS("dydy", 6), "exact_button", "exact_key")
_PARTS = (*(f"{name}_{s}" for s in "tp" for name in _EACH), *_BOTH, "n_valid", "duration")
_STATE_PARTS = {  # each state as a sum of `_PARTS` columns (a true run that met a predicted one counts twice)
    "num_bins": "+n_valid", "duration_ns": "+duration", "move_bins": "+has_move_t +has_move_p -both_move",
    "button_right": " ".join(f"+same_{name}" for name, _ in BUTTONS),
    "button_values": " ".join(f"+has_{name}_t +has_{name}_p -both_{name}" for name, _ in BUTTONS),
    "button_empty_bins": "+n_valid -has_button_t -has_button_p +both_button",
    "key_right": "+same_name", "key_values": "+has_name_t +has_name_p -both_name",
    "key_empty_bins": "+n_valid -key_t -key_p +both_key", "key_true_bins": "+key_t", "key_exact_bins": "+exact_key",
    "button_true_bins": "+has_button_t", "button_pred_bins": "+has_button_p", "button_exact_bins": "+exact_button",
    **{f"{kind}_{side}{axis}{sq}.{j}": f"+{a}d{axis}{sq}.{j}_{side}" for axis in "xy" for side in "tp"
       for kind, sq, a, n in (("sum", "", "", 3), ("sum", "2", "", 6), ("abs", "", "a", 3)) for j in range(n)},
    **{f"sum_t{axis}p{axis}.{j}": f"+d{axis}d{axis}.{j}" for axis in "xy" for j in range(6)}}
_PAIRS = 1 << 20  # (shift, run) pairs a block of `d2e_states` holds at most


@functools.lru_cache(maxsize=None)
def _constants(shifts: tuple, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The shifts [S] and the map from `d2e_states`' parts to `STATES` [len(_PARTS), len(STATES)] on ``device``;
    cached (no copy to a GPU per update)."""
    to_states = torch.zeros((len(_PARTS), len(STATES)), dtype=torch.float64)
    for state, terms in _STATE_PARTS.items():
        for term in terms.split():
            to_states[_PARTS.index(term[1:]), S[state]] += 1 if term[0] == "+" else -1
    return torch.tensor(shifts, dtype=torch.long).to(device), to_states.to(device)


def _runs(key: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys [n + 1], sums [n + 1, c])``: the runs of equal keys of ``key`` [n] sorted, at most n: each one's key
    (ascending; `_NO_RUN` past the last run) and the sums of ``values`` [n, c] over its entries (int64: exact)."""
    key, order = torch.sort(key)
    new = torch.ones_like(key, dtype=torch.bool)
    new[1:] = key[1:] != key[:-1]
    run = new.cumsum(0) - 1
    keys = torch.full((len(key) + 1,), _NO_RUN, dtype=torch.long, device=key.device).scatter_(0, run, key)
    sums = torch.zeros((len(key) + 1, values.shape[1]), dtype=torch.long, device=key.device)
    return keys, sums.index_add_(0, run, values.index_select(0, order).long())


def _digits(x: torch.Tensor) -> torch.Tensor:
    """[3, ...] float64: the limbs of int64 ``x`` [...]: x = sum_j d_j 2**(21 j), d_j in [0, 2**21) but the last
    (signed, |d_2| <= 2**21)."""
    shifts, masks, _, _ = _limb_constants(x.device, x.dim())
    return ((x[None] >> shifts) & masks).double()


def _product_limbs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[6, ...] float64: limbs of the products of the numbers whose `_digits` are ``a``, ``b`` ([3, ...], the rest
    broadcast; |a|, |b| < 2**63, so the product is below 2**126): the digit products summed by place (< 2**44, exact
    in float64), then each limb's carry to the next, all at once, twice: each limb in [-4, 2**21 + 4), the last about
    a * b / 2**105 (not the unique digits: `_add_product` carries the same way)."""
    outer = a[:, None] * b[None, :]  # [3, 3, ...]
    _, _, conv, keep = _limb_constants(a.device, outer.dim() - 2)
    c = (conv @ outer.reshape(9, -1)).view(6, *outer.shape[2:])
    for _ in range(2):
        carry = torch.floor(c * 2.0 ** -DIGIT_BITS)
        c = c - carry * keep + torch.cat([torch.zeros_like(carry[:1]), carry[:-1]])
    return c


@functools.lru_cache(maxsize=None)
def _limb_constants(device, dims: int) -> tuple[torch.Tensor, ...]:
    """On ``device`` (cached: no copy per update), shaped to broadcast over ``dims`` trailing dimensions: `_digits`'
    shifts and masks (the last limb keeps its sign); [6, 9] where limb i of a times limb j of b lands (i + j); what a
    carry takes from each of a product's 6 limbs (2**21 but from the last)."""
    view = (-1, *(1,) * dims)
    conv = torch.zeros((6, 9), dtype=torch.float64)
    for i in range(3):
        for j in range(3):
            conv[i + j, 3 * i + j] = 1
    return (torch.arange(0, 3 * DIGIT_BITS, DIGIT_BITS).view(view).to(device),
            torch.tensor([_MASK, _MASK, -1]).view(view).to(device), conv.to(device),
            torch.tensor([2.0 ** DIGIT_BITS] * 5 + [0.0], dtype=torch.float64).view(view).to(device))


def _compiled_states(truth: D2EEvents, pred: D2EEvents, start_ns: torch.Tensor, end_ns: torch.Tensor, bin_ns: int,
                     shifts: Sequence[int], group: Optional[torch.Tensor], groups: int) -> torch.Tensor:
    """`d2e_states` by `_binned` (CPU tensors): the same [groups, shifts, STATES] sums ([shifts, STATES] without
    ``group``)."""
    a = lambda *x: [np.ascontiguousarray(t.numpy(), dtype=np.int64) for t in x]  # noqa: E731
    start, end = a(start_ns.long(), end_ns.long())
    nb = a(num_bins(start_ns.long(), end_ns.long(), bin_ns))[0]
    events = [a(*(getattr(ev, f.name) for f in fields(D2EEvents))) for ev in (truth, pred)]
    return _binned_states(*events, start, end, nb, bin_ns, shifts, group, groups)


def _binned_states(truth: list, pred: list, start: np.ndarray, end: np.ndarray, nb: np.ndarray, bin_ns: int,
                   shifts: Sequence[int], group: Optional[torch.Tensor], groups: int) -> torch.Tensor:
    """`_binned`'s sums of each side's `D2EEvents` fields (int64 arrays, in order) over ranges [start, end) of
    ``nb`` bins [B]: [groups, shifts, STATES] ([shifts, STATES] without ``group``)."""
    out = np.zeros((groups, len(shifts), len(STATES)))
    _binned(*truth, *pred, start, end, nb, np.zeros(len(start), np.int64) if group is None else
            np.ascontiguousarray(group.numpy(), dtype=np.int64), np.array(shifts, dtype=np.int64), bin_ns, out)
    out = torch.from_numpy(out)
    return out if group is not None else out[0]


@_jit
def _bin_side(seq, ns, is_key, key_code, dx, dy, flags, counts, start, end, first, bin_ns, moves, sums, buttons,
              keys, side):
    """One side's events into its per-bin tables (the bins of all sequences numbered in a row from ``first``):
    ``moves`` [bins, sides] the moves (button_flags 0), ``sums`` [bins, sides, 2] their dx, dy; ``buttons``
    [bins, sides, buttons + 1] each button name's count (bit i of button_flags) and the events with any; ``keys``
    [bins, sides] the keyboard events (this side's: ``side``). Returns the
    keyboard events' (bin, key name) codes, sorted (bin x 2**32 + name)."""
    codes = np.empty(len(ns), np.int64)
    n_codes = 0
    for e in range(len(ns)):
        b = seq[e]
        if not counts[e] or ns[e] < start[b] or ns[e] >= end[b]:
            continue
        g = first[b] + (ns[e] - start[b]) // bin_ns
        if is_key[e]:
            keys[g, side] += 1
            codes[n_codes] = (g << 32) + key_code[e]
            n_codes += 1
        elif flags[e] == 0:
            moves[g, side] += 1
            sums[g, side, 0] += dx[e]
            sums[g, side, 1] += dy[e]
        elif flags[e] & ((1 << _N_BUTTONS) - 1):
            for i in range(_N_BUTTONS):
                buttons[g, side, i] += (flags[e] >> i) & 1
            buttons[g, side, _N_BUTTONS] += 1
    return np.sort(codes[:n_codes])


# `STATES`' places, as the compiled loop reads them (by axis: x, y)
_NUM_BINS, _DURATION, _MOVE_BINS = S["num_bins"], S["duration_ns"], S["move_bins"]
_BUTTON_RIGHT, _BUTTON_VALUES, _BUTTON_EMPTY = S["button_right"], S["button_values"], S["button_empty_bins"]
_KEY_RIGHT, _KEY_VALUES, _KEY_EMPTY = S["key_right"], S["key_values"], S["key_empty_bins"]
_KEY_TRUE, _KEY_EXACT = S["key_true_bins"], S["key_exact_bins"]
_BUTTON_TRUE, _BUTTON_PRED, _BUTTON_EXACT = S["button_true_bins"], S["button_pred_bins"], S["button_exact_bins"]
_SUM_T, _SUM_P, _ABS_T, _ABS_P, _SUM_T2, _SUM_P2, _SUM_TP = (
    tuple(S[f"{name.format(a=a)}.0"] for a in "xy") for name in (
        "sum_t{a}", "sum_p{a}", "abs_t{a}", "abs_p{a}", "sum_t{a}2", "sum_p{a}2", "sum_t{a}p{a}"))


@_jit
def _add_limbs(row, at, x):
    """row[at:at + 3] += the limbs of int64 x (`_digits`)."""
    row[at] += x & _MASK
    row[at + 1] += (x >> DIGIT_BITS) & _MASK
    row[at + 2] += x >> (2 * DIGIT_BITS)


@_jit
def _carry(c0, c1, c2, c3, c4, c5):
    """Each limb's carry to the next, all at once (`_product_limbs`' step; the last limb keeps its sign)."""
    return (c0 & _MASK, (c1 & _MASK) + (c0 >> DIGIT_BITS), (c2 & _MASK) + (c1 >> DIGIT_BITS),
            (c3 & _MASK) + (c2 >> DIGIT_BITS), (c4 & _MASK) + (c3 >> DIGIT_BITS), c5 + (c4 >> DIGIT_BITS))


@_jit
def _add_product(row, at, a, b):
    """row[at:at + 6] += the limbs of a * b as `_product_limbs` gives them (the same carries, in int64)."""
    a0, a1, a2 = a & _MASK, (a >> DIGIT_BITS) & _MASK, a >> (2 * DIGIT_BITS)
    b0, b1, b2 = b & _MASK, (b >> DIGIT_BITS) & _MASK, b >> (2 * DIGIT_BITS)
    c = _carry(*_carry(a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2, 0))
    for j in range(6):
        row[at + j] += c[j]


@_jit
def _binned(t_seq, t_ns, t_is_key, t_code, t_dx, t_dy, t_flags, t_counts, p_seq, p_ns, p_is_key, p_code, p_dx, p_dy,
            p_flags, p_counts, start, end, nb, group, shifts, bin_ns, out):
    """`d2e_states`' sums as loops, read from the protocol: per bin and side its moves' sums, its button names' and
    key names' counts; then per shift k, each true bin i of a sequence against predicted bin i + k where both exist
    (``out`` [groups, shifts, STATES] +=; ``row[i]``: `STATES` in order)."""
    B = len(start)
    first = np.zeros(B + 1, np.int64)
    for b in range(B):
        first[b + 1] = first[b] + nb[b]
    T = first[B]
    moves, keys = np.zeros((T, 2), np.int64), np.zeros((T, 2), np.int64)
    sums, buttons = np.zeros((T, 2, 2), np.int64), np.zeros((T, 2, _N_BUTTONS + 1), np.int64)
    codes = (_bin_side(t_seq, t_ns, t_is_key, t_code, t_dx, t_dy, t_flags, t_counts, start, end, first, bin_ns,
                       moves, sums, buttons, keys, 0),
             _bin_side(p_seq, p_ns, p_is_key, p_code, p_dx, p_dy, p_flags, p_counts, start, end, first, bin_ns,
                       moves, sums, buttons, keys, 1))
    runs = []  # each side's key names: the distinct codes, their counts, each bin's first run (bins + 1)
    for c in codes:
        distinct, count = np.empty(len(c), np.int64), np.zeros(len(c), np.int64)
        n = 0
        for i in range(len(c)):
            if i == 0 or c[i] != c[i - 1]:
                distinct[n] = c[i]
                n += 1
            count[n - 1] += 1
        at = np.zeros(T + 1, np.int64)
        for i in range(n):
            at[(distinct[i] >> 32) + 1] += 1
        for g in range(T):
            at[g + 1] += at[g]
        runs.append((distinct[:n] & 0xFFFFFFFF, count[:n], at))
    (t_name, t_count, t_at), (p_name, p_count, p_at) = runs
    for si in range(len(shifts)):
        k = shifts[si]
        for b in range(B):
            row = out[group[b], si]
            row[_DURATION] += max(end[b] - start[b], 0)
            for i in range(max(0, -k), min(nb[b], nb[b] - k)):
                g, j = first[b] + i, first[b] + i + k
                row[_NUM_BINS] += 1
                if moves[g, 0] or moves[j, 1]:  # the Pearson bins
                    row[_MOVE_BINS] += 1
                    for axis in range(2):  # a 0 adds nothing (its limbs are 0)
                        t, p = sums[g, 0, axis], sums[j, 1, axis]
                        if t:
                            _add_limbs(row, _SUM_T[axis], t)
                            _add_limbs(row, _ABS_T[axis], abs(t))
                            _add_product(row, _SUM_T2[axis], t, t)
                        if p:
                            _add_limbs(row, _SUM_P[axis], p)
                            _add_limbs(row, _ABS_P[axis], abs(p))
                            _add_product(row, _SUM_P2[axis], p, p)
                        if t and p:
                            _add_product(row, _SUM_TP[axis], t, p)
                same = True  # every name's counts equal (the bin's multiset of names)
                for n in range(_N_BUTTONS):  # a name seen on either side: a value, right when the counts are equal
                    ct, cp = buttons[g, 0, n], buttons[j, 1, n]
                    if ct or cp:
                        row[_BUTTON_VALUES] += 1
                        row[_BUTTON_RIGHT] += ct == cp
                        same &= ct == cp
                t_has, p_has = buttons[g, 0, _N_BUTTONS] > 0, buttons[j, 1, _N_BUTTONS] > 0
                row[_BUTTON_EMPTY] += not t_has and not p_has
                row[_BUTTON_TRUE] += t_has
                row[_BUTTON_PRED] += p_has
                row[_BUTTON_EXACT] += t_has and same
                x, y = t_at[g], p_at[j]  # the two bins' key names, merged in order
                same = True
                while x < t_at[g + 1] or y < p_at[j + 1]:
                    row[_KEY_VALUES] += 1
                    if y == p_at[j + 1] or (x < t_at[g + 1] and t_name[x] < p_name[y]):
                        x, same = x + 1, False
                    elif x == t_at[g + 1] or p_name[y] < t_name[x]:
                        y, same = y + 1, False
                    else:
                        row[_KEY_RIGHT] += t_count[x] == p_count[y]
                        same &= t_count[x] == p_count[y]
                        x, y = x + 1, y + 1
                row[_KEY_EMPTY] += keys[g, 0] == 0 and keys[j, 1] == 0
                row[_KEY_TRUE] += keys[g, 0] > 0
                row[_KEY_EXACT] += keys[g, 0] > 0 and same


def d2e_keys(states: torch.Tensor, empty_bins_as_correct: bool = False, shifts: Sequence[int] = (0,),
             prefix: str = KEY_PREFIX) -> dict[str, float]:
    """The keys of `d2e_states`' rows (one per shift of ``shifts``; the plain keys from shift 0): ``d2e/num_bins``,
    ``d2e/duration_s``, ``d2e/mouse_move/{pearson_x, pearson_y, pearson_x_all_bins, pearson_y_all_bins, scale_ratio_x,
    scale_ratio_y, sample_count}``,
    ``d2e/mouse_button/{button_accuracy, sample_count, precision, recall, f1}``, ``d2e/keyboard/{key_accuracy,
    sample_count, strict_accuracy, strict_sample_count}``, ``.../{false_positive_rate, false_positive_sample_count}``
    of both; a value upstream reports as none is left out. With shifts other than 0: every key but the duration at
    each shift k as ``..._shift_{k}bins``, and ``d2e/best_shift_bins`` (`best_shift`)."""
    shifts = [int(k) for k in shifts]
    rows = [[float(v) for v in row] for row in states.double().cpu()]
    by_shift = {k: _row_keys(row, empty_bins_as_correct) for k, row in zip(shifts, rows)}
    out = {"num_bins": rows[shifts.index(0)][S["num_bins"]], "duration_s": rows[shifts.index(0)][S["duration_ns"]] / 1e9}
    out.update(by_shift[0])
    if shifts != [0]:
        for k, keys in by_shift.items():
            out.update({f"{name}_shift_{k}bins": v for name, v in keys.items()})
        best = best_shift(by_shift)
        if best is not None:
            out["best_shift_bins"] = float(best)
    return {f"{prefix}/{name}": v for name, v in out.items()}


def _row_keys(row: list[float], empty_bins_as_correct: bool) -> dict[str, float]:
    """One row's keys (without the ``d2e/`` prefix); ``num_bins``: the bins compared."""
    v = {name: int(row[S[name]]) for name in COUNTS}  # integers: exact below 2**53
    v.update({name: sum(int(row[S[f"{name}.{j}"]]) << (DIGIT_BITS * j) for j in range(limbs))
              for name, limbs in MOMENTS.items()})  # exact (Python integers)
    out = {}
    n = v["move_bins"]
    for axis in ("x", "y"):
        sums = [v[f"sum_{name}"] for name in (f"t{axis}", f"p{axis}", f"t{axis}2", f"p{axis}2", f"t{axis}p{axis}")]
        # the script's r over the bins where either side moved; the paper's over all bins compared (a bin without
        # a move adds 0 to every sum: the same sums, n = num_bins)
        for name, bins in ((f"pearson_{axis}", n), (f"pearson_{axis}_all_bins", v["num_bins"])):
            r = _pearson(bins, *sums)
            if r is not None:
                out[f"mouse_move/{name}"] = r
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
        out.update(_strict_keys(v, kind))
    out["num_bins"] = float(v["num_bins"])
    return out


def _pearson(n: int, st: int, sp: int, st2: int, sp2: int, stp: int) -> Optional[float]:
    """Pearson's r of n pairs from their exact integer sums: c = nΣtp - ΣtΣp, v = nΣt² - (Σt)², r = sign(c)
    sqrt(c² / (v_t v_p)), one rounding (|c| <= sqrt(v_t v_p): r in [-1, 1]); None below 2 pairs or with a constant
    side."""
    cov, var_t, var_p = n * stp - st * sp, n * st2 - st * st, n * sp2 - sp * sp  # n² (co)variances
    if n < 2 or var_t <= 0 or var_p <= 0:
        return None
    return math.copysign(math.sqrt(cov * cov / (var_t * var_p)), cov)


def _strict_keys(v: dict[str, int], kind: str) -> dict[str, float]:
    """The community's per-bin keys of ``kind`` (``"button"``, ``"key"``; fdm-d2e-reproduction's
    ``paper_idm_metrics.py``, "strict"): a bin is alike when every name's count is equal on both sides. Keyboard:
    the share of the bins with a true key event that are alike; buttons: TP the alike bins with a true button name,
    precision TP / the bins with a predicted one, recall TP / the bins with a true one, F1 2TP / (both); each kind's
    false-positive rate: the share of the bins without a true event that have a predicted one. A ratio over nothing
    is left out."""
    prefix, true, out = ("mouse_button" if kind == "button" else "keyboard"), v[f"{kind}_true_bins"], {}
    if kind == "button":
        tp, pred = v["button_exact_bins"], v["button_pred_bins"]
        for name, num, den in (("precision", tp, pred), ("recall", tp, true), ("f1", 2 * tp, true + pred)):
            if den:
                out[f"mouse_button/{name}"] = num / den
    else:
        out["keyboard/strict_sample_count"] = float(true)
        if true:
            out["keyboard/strict_accuracy"] = v["key_exact_bins"] / true
    without = v["num_bins"] - true  # bins without a true event; those with a predicted one: the rest but the empty
    out[f"{prefix}/false_positive_sample_count"] = float(without)
    if without:
        out[f"{prefix}/false_positive_rate"] = (without - v[f"{kind}_empty_bins"]) / without
    return out


BEST_SHIFT_SCORES = ("keyboard/key_accuracy", "mouse_button/button_accuracy", "mouse_move/pearson")


def best_shift(by_shift: dict[int, dict[str, float]]) -> Optional[int]:
    """The shift with the highest mean of the key accuracy, the button accuracy and the mouse Pearson r (the mean of
    x and y; each of the three where defined); ties: the smallest |k|, then the smallest k. None when no shift has
    any of them, or none scores above 0 (nothing right at any shift: no shift is better)."""
    scores = {}
    for k, keys in by_shift.items():
        pearson = [keys[f"mouse_move/pearson_{a}"] for a in ("x", "y") if f"mouse_move/pearson_{a}" in keys]
        parts = [keys[n] for n in BEST_SHIFT_SCORES[:2] if n in keys] + ([sum(pearson) / len(pearson)] if pearson else [])
        if parts:
            scores[k] = sum(parts) / len(parts)
    if not scores or max(scores.values()) <= 0:
        return None
    return min(scores, key=lambda k: (-scores[k], abs(k), k))


# ------------------------------------------------------------------------------------------ decoded token sequences
def batch_events(batch, window_ns: int) -> tuple[D2EEvents, D2EEvents, torch.Tensor, torch.Tensor]:
    """``(truth, pred, start_ns, end_ns)`` of a decoded `EventBatch`: each side's events on the row's time axis (all
    of them, those that count: its valid keyboard and mouse events; nothing selected, no host read), and each row's
    range.

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
        key = f.category == int(Category.KEYBOARD)
        mouse = (f.category == int(Category.MOUSE_OP)) | (f.category == int(Category.MOUSE_NOP))
        sides.append(D2EEvents(s, ns.long(), key, (f.vk * 2 + f.action).long(), f.dx.long(), f.dy.long(),
                               f.button_flags.long(), ok & (key | mouse)))
    return sides[0], sides[1], start, end


def batch_states(batch, window_ns: int, bin_ms: float, bin_shifts: Sequence[int] = (),
                 group: Optional[torch.Tensor] = None, groups: int = 1, compiled: bool = False) -> torch.Tensor:
    """`d2e_states` of a decoded batch's rows (`batch_events`), one row per shift of `shift_rows` (by group of
    sequences with ``group``). ``compiled`` (CPU tensors, numba; paired by index): one compiled pass from the decoded
    arrays to the events on their time axes and the ranges (`_batch_events`, `batch_events` as loops), then
    `_binned`: no torch op per event; else `batch_events` and `d2e_states` (``compiled`` as there)."""
    bin_ns, shifts = bin_ns_of(bin_ms), shift_rows(bin_shifts)
    if compiled and batch.time_matching is None and batch.seq_idx.device.type == "cpu" and kernel_available():
        t, p = batch.target, batch.generated if batch.generated is not None else batch.pred
        p_seq = batch.generated_seq if batch.generated is not None else batch.seq_idx
        a = lambda x: np.ascontiguousarray(x.numpy(), dtype=np.int64)  # noqa: E731  (no copy: the kernel's arrays)
        *sides, start, end, nb = _batch_events(a(batch.seq_idx), a(t.status), a(t.values), a(p_seq), a(p.status),
                                               a(p.values), batch.generated is not None, batch.num_sequences,
                                               window_ns, STEP_BACK_NS, bin_ns)
        n = len(fields(D2EEvents))
        return _binned_states(sides[:n], sides[n:], start, end, nb, bin_ns, shifts, group, groups)
    truth, pred, start, end = batch_events(batch, window_ns)
    return d2e_states(truth, pred, start, end, bin_ns, shifts, group, groups, compiled)


_CATEGORY, _TIMESTAMP, _VK, _ACTION, _DX, _DY, _FLAGS = (VALUE_COLUMNS.index(name) for name in (
    "category", "timestamp_ns", "vk", "action", "dx", "dy", "button_flags"))


@_jit
def _unwrap_side(seq, status, values, origin, window_ns, step_back_ns, out):
    """`unwrap_ns` as a loop: ``out`` [n] the absolute times of a side's valid events in (row, position) order from
    their row's ``origin`` (0 where not valid)."""
    half, prev = window_ns // 2, -1
    for e in range(len(seq)):
        if status[e] != VALID:
            continue
        t = values[e, _TIMESTAMP]
        if prev < 0 or seq[prev] != seq[e]:  # the row's first valid event
            o = origin[seq[e]]
            out[e] = o + (t - o + half) % window_ns - half
        else:
            d = (t - values[prev, _TIMESTAMP]) % window_ns
            out[e] = out[prev] + (d - window_ns if d > window_ns - step_back_ns else d)
        prev = e


@_jit
def _side_events(seq, values, ok, ns):
    """One side's `D2EEvents` fields (int64 arrays, in order) from its decoded rows: ``ok`` [n] whether an event may
    count (a valid one; under teacher forcing also its target valid), ``ns`` its time."""
    n = len(seq)
    out = np.zeros((6, n), np.int64)
    is_key, code, dx, dy, flags, counts = out[0], out[1], out[2], out[3], out[4], out[5]
    for e in range(n):
        c = values[e, _CATEGORY]
        is_key[e] = c == KEYBOARD_CAT
        code[e] = values[e, _VK] * 2 + values[e, _ACTION]
        dx[e], dy[e], flags[e] = values[e, _DX], values[e, _DY], values[e, _FLAGS]
        counts[e] = ok[e] and (c == KEYBOARD_CAT or c == MOUSE_OP_CAT or c == MOUSE_NOP_CAT)
    return seq, ns, is_key, code, dx, dy, flags, counts


@_jit
def _batch_events(seq, t_status, t_values, p_seq, p_status, p_values, generation, B, window_ns, step_back_ns,
                  bin_ns):
    """`batch_events` (index pairing) and `num_bins` as loops over the decoded arrays: both sides' `D2EEvents` fields
    (int64 arrays, in order), then each row's start, end and bins [B]."""
    n = len(seq)
    origin, start, end, seen = np.zeros(B, np.int64), np.zeros(B, np.int64), np.zeros(B, np.int64), np.zeros(B, np.bool_)
    for e in range(n - 1, -1, -1):  # each row's first valid target event's timestamp
        if t_status[e] == VALID:
            origin[seq[e]] = t_values[e, _TIMESTAMP]
    t_ns, t_ok = np.zeros(n, np.int64), t_status == VALID
    _unwrap_side(seq, t_status, t_values, origin, window_ns, step_back_ns, t_ns)
    for e in range(n):  # the range: the first to the last valid target time
        if t_ok[e]:
            r = seq[e]
            start[r] = t_ns[e] if not seen[r] else min(start[r], t_ns[e])
            end[r] = t_ns[e] if not seen[r] else max(end[r], t_ns[e])
            seen[r] = True
    if generation:
        p_ns = np.zeros(len(p_seq), np.int64)
        _unwrap_side(p_seq, p_status, p_values, origin, window_ns, step_back_ns, p_ns)
        p_ok = p_status == VALID
    else:  # teacher forcing: each prediction at its target's time plus the wrapped difference of the timestamps
        half = window_ns // 2
        p_ns = t_ns + (p_values[:, _TIMESTAMP] - t_values[:, _TIMESTAMP] + half) % window_ns - half
        p_ok = (p_status == VALID) & t_ok
    nb = np.zeros(B, np.int64)
    for r in range(B):
        if end[r] > start[r]:
            nb[r] = (end[r] - start[r] - 1) // bin_ns + 1
    return (*_side_events(seq, t_values, t_ok, t_ns), *_side_events(p_seq, p_values, p_ok, p_ns), start, end, nb)
