"""What a generated sequence does (generation): where the cursor ends up, what keys get typed, whether the mouse moved.

Read from a decoded `EventBatch`: its target rows and every generated event (``batch.generated``). Per sequence, each
side's valid events in order; the cursor path P(k) is the running sum of the (dx, dy) of its mouse events through its
k-th valid event, in raw device units (``_mu``), from the first event that ``update`` sees (the callback passes the
continuation after the prompt). At the k-th valid true event, P_gen is the generated path through its first
min(k, n_gen) valid events (``pairing="index"``), or over its valid events whose absolute time is <= the true event's
(``"time"``). Fixed-shape torch ops (no host sync); the per-event samples come back NaN where an event is not one.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..decode import kernel
from ..decode.event_batch import VALUE_COLUMNS, EventBatch, EventFields
from ..schema import Category, Status
from .declare import exact_parts, per_group

BUTTON_DOWN = 0x001 | 0x004 | 0x010  # button_flags of a left, right or middle button going down
DX = VALUE_COLUMNS.index("dx")  # then dy
FLAGS = VALUE_COLUMNS.index("button_flags")
VALID, MOUSE_OP, MOUSE_NOP = int(Status.VALID), int(Category.MOUSE_OP), int(Category.MOUSE_NOP)


def _generated(batch: EventBatch) -> tuple[EventFields, torch.Tensor]:
    if batch.generated is None:
        raise ValueError("this EventBatch has no generated side (EventBatch.generated): decode it with "
                         "decode_batch(preds, target, vocab, alignment='generation')")
    return batch.generated, _long(batch.generated_seq)


def _long(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.long else x.long()


def _mouse(fields: EventFields) -> torch.Tensor:
    """Valid mouse events (an event that does not decode has category INVALID)."""
    category = fields.category
    return (category == int(Category.MOUSE_OP)) | (category == int(Category.MOUSE_NOP))


def _counts(rows: torch.Tensor, weights: torch.Tensor, num_sequences: int) -> torch.Tensor:
    """Per sequence, the sum of ``weights`` (int64) over its entries."""
    return torch.zeros(num_sequences, dtype=torch.long, device=rows.device).index_add_(0, rows, weights.long())


def cursor_offsets(batch: EventBatch, extras: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clicks [n_target_events], ends [num_sequences])``: d = |P_gen - P_true| (Euclidean, raw units) at each valid
    true button-down event (`BUTTON_DOWN`; NaN at the other rows), and at the last valid true event of each sequence
    with a valid true mouse event (NaN for the others). Kept in ``extras`` (one update reads it twice). On the
    compiled CPU path (``extras["host_reads"]``; index pairing) one compiled pass, `_cursor_offsets_by_index`, else
    the torch ops."""
    if "cursor_offsets" in extras:
        return extras["cursor_offsets"]
    target, (generated, g_row) = batch.target, _generated(batch)
    if extras.get("host_reads") and batch.time_matching is None and kernel.available():
        B = batch.num_sequences
        clicks, ends = np.empty(len(target.status)), np.empty(B)
        _cursor_offsets_by_index(_long(batch.seq_idx).numpy(), target.status.numpy(), target.values.numpy(),
                                 g_row.numpy(), generated.status.numpy(), generated.values.numpy(), B, clicks, ends)
        extras["cursor_offsets"] = torch.from_numpy(clicks).sqrt_(), torch.from_numpy(ends).sqrt_()  # torch's sqrt
        return extras["cursor_offsets"]
    B, t_row, N = batch.num_sequences, _long(batch.seq_idx), len(batch.target.status)
    t_ok, g_ok = target.status == int(Status.VALID), generated.status == int(Status.VALID)
    mouse = [_mouse(f) for f in (target, generated)]
    moves = [f.values[:, DX:DX + 2] * m[:, None] for f, m in zip((target, generated), mouse)]  # 0 unless mouse
    if batch.time_matching is None:  # the generated path through the first min(k, n_gen) valid generated events
        gen_path = _path_by_index(t_ok, t_row, g_ok, g_row, moves[1], B)
    else:
        gen_path = _path_by_time(batch.time_matching, t_row, g_row, moves[1], B)
    gap = gen_path - _row_cumsum(moves[0], t_row, B)
    d = gap.double().pow(2).sum(1).sqrt()
    clicks = torch.where(t_ok & ((target.button_flags & BUTTON_DOWN) != 0), d, float("nan"))
    last = torch.full((B,), -1, dtype=torch.long, device=d.device).scatter_reduce(
        0, t_row, torch.where(t_ok, torch.arange(N, device=d.device), -1), "amax")
    with_mouse = _counts(t_row, mouse[0], B) > 0
    ends = torch.where(with_mouse, torch.cat([d, d.new_zeros(1)]).index_select(0, last.clamp(min=0)), float("nan"))
    extras["cursor_offsets"] = clicks, ends
    return clicks, ends


@kernel._jit
def _cursor_offsets_by_index(t_row, t_status, t_values, g_row, g_status, g_values, num_sequences, clicks, ends):
    """`cursor_offsets` under index pairing, in one pass over both sides (entries sorted by row): in each row, at its
    k-th valid true event, the generated path sums the generated moves before the row's (k+1)-th valid generated
    event; writes d^2 = gap_x^2 + gap_y^2 of the integer gap in float64 (NaN: none), as the torch ops compute it
    before their square root (torch's: not always numpy's to the last bit, so the caller takes it)."""
    i = j = 0  # the next true, generated event
    first = 0.0  # d^2 at entry 0 (where the torch ops read a row without a valid true event: none has a mouse event)
    for b in range(num_sequences):
        t_x = t_y = g_x = g_y = 0  # the running paths
        count = g_count = 0  # valid events so far: true, and generated among those summed
        mouse, last = False, np.nan  # a true mouse event in the row; d^2 at its last valid true event
        while j < g_row.shape[0] and g_row[j] < b:
            j += 1
        while i < t_row.shape[0] and t_row[i] == b:
            if t_values[i, 0] == MOUSE_OP or t_values[i, 0] == MOUSE_NOP:
                t_x, t_y, mouse = t_x + t_values[i, DX], t_y + t_values[i, DX + 1], True
            ok = t_status[i] == VALID
            count += ok
            while j < g_row.shape[0] and g_row[j] == b and g_count + (g_status[j] == VALID) <= count:
                g_count += g_status[j] == VALID
                if g_values[j, 0] == MOUSE_OP or g_values[j, 0] == MOUSE_NOP:
                    g_x, g_y = g_x + g_values[j, DX], g_y + g_values[j, DX + 1]
                j += 1
            x, y = float(g_x - t_x), float(g_y - t_y)
            d = x * x + y * y
            clicks[i] = d if ok and (t_values[i, FLAGS] & BUTTON_DOWN) != 0 else np.nan
            if ok:
                last = d
            if i == 0:
                first = d
            i += 1
        ends[b] = (first if np.isnan(last) else last) if mouse else np.nan


def _path_by_index(t_ok, t_row, g_ok, g_row, g_moves, num_sequences: int) -> torch.Tensor:
    """[n_target_events, 2]: at the true event with k valid true events of its row so far, the sum of ``g_moves`` over
    the generated events of its row with at most k valid generated events so far (a search: both sides sorted by row,
    the counts non-decreasing along it; an invalid event moves 0)."""
    B, N, M = num_sequences, len(t_row), len(g_row)
    rows = torch.cat([t_row, g_row + B])
    counts = _row_cumsum(torch.cat([t_ok, g_ok]).long()[:, None], rows, 2 * B)[:, 0]  # valid events so far
    scale = N + M + 1  # (row, count) as one ordered number
    codes = rows * scale + counts
    g_codes = codes[N:] - B * scale
    through = torch.searchsorted(g_codes, codes[:N], right=True)
    path = torch.nn.functional.pad(g_moves.cumsum(0), (0, 0, 1, 0))  # [M + 1, 2]: the first m generated events' sum
    return path.index_select(0, through) - path.index_select(0, torch.searchsorted(g_codes, rows[:N] * scale))


def _path_by_time(found, t_row, g_row, g_moves, num_sequences: int) -> torch.Tensor:
    """[n_target_events, 2]: at each true event, the sum of ``g_moves`` over the generated events of its row whose
    absolute time is at most its own (`TimeMatching`'s times): both sides sorted by (row, time), generated first on
    ties, the running sum read at each true event, less the rows before."""
    N, M = len(t_row), len(g_row)
    row = torch.cat([g_row, t_row])
    key = torch.cat([found.generated_ns, found.target_ns]) * 2 + (torch.arange(M + N, device=t_row.device) >= M)
    order = torch.argsort(key, stable=True)
    order = order.index_select(0, torch.argsort(row.index_select(0, order), stable=True))
    running = torch.cat([g_moves, g_moves.new_zeros(N, 2)]).index_select(0, order).cumsum(0)
    at = torch.empty_like(order).index_copy_(0, order, torch.arange(M + N, device=order.device))[M:]
    rows_before = _row_cumsum(g_moves, g_row, num_sequences, exclusive_totals=True).index_select(0, t_row)
    return running.index_select(0, at) - rows_before


def _row_cumsum(x: torch.Tensor, rows: torch.Tensor, num_sequences: int, exclusive_totals: bool = False) -> torch.Tensor:
    """The running sum of ``x`` [n, c] along each sequence (entries sorted by row), restarted at each row; or, with
    ``exclusive_totals``, per sequence the total of the rows before it [num_sequences, c]."""
    totals = torch.zeros((num_sequences, x.shape[1]), dtype=x.dtype, device=x.device).index_add_(0, rows, x)
    before = totals.cumsum(0) - totals
    return before if exclusive_totals else x.cumsum(0) - before.index_select(0, rows)


def key_sequence_sums(batch: EventBatch, extras: Optional[dict] = None) -> torch.Tensor:
    """[4] float64: sum over rows of Levenshtein(generated keys, true keys), the true keys, rows whose keys are equal
    and rows with a true key; a key = (vk, press/release) of a valid keyboard event, in order ([groups, 4] by group of
    sequences with ``extras["group"]``: `per_group`). With the torch decoder's bound on a row's keyboard events
    (`EventBatch.keyboard_bound`) the distance is `levenshtein_torch`'s (no host sync), else on CPU tensors
    `levenshtein`'s (the compiled CPU path)."""
    (generated, g_row), B = _generated(batch), batch.num_sequences
    t_row = _long(batch.seq_idx)
    if batch.keyboard_bound is None and t_row.device.type == "cpu":
        codes = [_key_codes(f.status, f.values) for f in (batch.target, generated)]
        distance = levenshtein(codes[0], t_row, codes[1], g_row, B)
        length = _counts(t_row, codes[0] >= 0, B)
    else:  # both sides at once
        codes = _key_codes(torch.cat([batch.target.status, generated.status]),
                           torch.cat([batch.target.values, generated.values]))
        distance, length = _levenshtein_rows(codes, torch.cat([t_row, g_row + B]), B, batch.keyboard_bound)
    typed = length > 0
    if extras is None or extras.get("group") is None:
        return torch.stack([distance, length, (distance == 0) & typed, typed]).sum(1, dtype=torch.float64)
    rows = torch.stack([distance, length, (distance == 0) & typed, typed], 1).double()
    return per_group(rows, torch.arange(B, device=rows.device), extras)


def _key_codes(status: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """vk x 2 + action of the valid keyboard events, -1 for the others."""
    vk, action = values[:, VALUE_COLUMNS.index("vk")], values[:, VALUE_COLUMNS.index("action")]
    keys = (status == int(Status.VALID)) & (values[:, 0] == int(Category.KEYBOARD))
    return torch.where(keys, vk * 2 + action, -1)


def levenshtein(a: torch.Tensor, a_row: torch.Tensor, b: torch.Tensor, b_row: torch.Tensor,
                num_sequences: int) -> torch.Tensor:
    """[num_sequences]: per row, the edit distance (insertions, deletions, substitutions, each 1) between its codes of
    ``a`` and of ``b`` (entries sorted by row; negative codes are no entries). Exact and bit-parallel (rapidfuzz's
    Levenshtein over the rows' code lists: O(n m / 64), not a full table), on the CPU (tensors elsewhere are copied
    there and back: host syncs; `levenshtein_torch` is the same in torch ops, on their device)."""
    from rapidfuzz.distance import Levenshtein

    a_np, b_np, a_rows, b_rows = np.split(torch.cat([a, b, a_row, b_row]).cpu().numpy(),
                                          np.cumsum([len(a), len(b), len(a_row)]))
    a_keep, b_keep = a_np >= 0, b_np >= 0
    a_size, b_size = (np.bincount(rows[keep], minlength=num_sequences)
                      for rows, keep in ((a_rows, a_keep), (b_rows, b_keep)))
    a_start, b_start = (np.concatenate([[0], np.cumsum(size)]).tolist() for size in (a_size, b_size))
    a_list, b_list = a_np[a_keep].tolist(), b_np[b_keep].tolist()
    out = (a_size + b_size).tolist()  # the distance when one side is empty
    for r in np.flatnonzero((a_size > 0) & (b_size > 0)).tolist():  # a loop over sequences, not events
        out[r] = Levenshtein.distance(a_list[a_start[r]:a_start[r + 1]], b_list[b_start[r]:b_start[r + 1]])
    return torch.tensor(out, dtype=torch.long).to(a.device)


_FAR = 1 << 40  # no path: far above any distance


def levenshtein_torch(a, a_row, b, b_row, num_sequences: int, widths=None) -> torch.Tensor:
    """`levenshtein` in torch ops on the tensors' device, exact (`_levenshtein_rows`). ``widths``: bounds on a row's
    number of entries of ``a`` and of ``b`` (host ints: `EventBatch.keyboard_bound`); None reads the largest (one host
    sync)."""
    return _levenshtein_rows(torch.cat([a, b]), torch.cat([a_row, b_row + num_sequences]), num_sequences, widths)[0]


def _levenshtein_rows(codes, rows, num_sequences: int, widths=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(distance, length of a)`` [B]: `levenshtein_torch` of the sides a (rows 0..B-1 of ``rows``) and b (rows
    B..2B-1), entries sorted by row.

    Both sides' entries are packed into rows (`_packed`): A [B, w_A], the side of the smaller bound, and G
    [B, 1 + w_G] (column 0 no entry). Then one step of the dynamic programme per column i of A over every row at
    once, kept as H[j] = D[j] - j - s (s: the row's entries of A so far; H[-1] a constant far above any value):
    H'[j] = min over k <= j of min(H[k], H[k - 1] + step[i, k]), step = (A_i != G_k) - 2 at an entry of A, else far
    (a padding column changes nothing: H is non-increasing). Three kernels a step, no host sync; the distance is
    H[len G] + len A + len G."""
    B = num_sequences
    packed, lengths, bounds = _packed(codes, rows, B, widths)
    sides = [(packed[:B], lengths[:B], bounds[0]), (packed[B:], lengths[B:], bounds[1])]
    if bounds[0] > bounds[1]:  # the edit distance is symmetric: step along the shorter side
        sides.reverse()
    (A, a_len, w_a), (G, g_len, w_g) = sides
    A, G = A[:, 1:w_a + 1], G[:, :w_g + 1]
    step = torch.where((A >= 0)[:, :, None], torch.where(A[:, :, None] == G[:, None, :], -2, -1), _FAR)
    H = torch.zeros((B, w_g + 2), dtype=torch.long, device=A.device)
    H[:, 0].fill_(_FAR)  # a fill, not a copy from the host
    here, before = H[:, 1:], H[:, :-1]  # views: H[j], H[j - 1]
    index = torch.empty_like(here)
    for step_i in step.unbind(1):
        torch.cummin(torch.minimum(here, before + step_i), 1, out=(here, index))
    return H.gather(1, g_len[:, None] + 1).squeeze(1) + a_len + g_len, lengths[:B]


def _packed(codes, rows, num_sequences: int, widths) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(codes [2 B, 1 + w], count [2 B], (w_a, w_b))``: each row's entries (codes >= 0; rows B.. are side b's) in
    order from column 1 (-1 elsewhere), ``count`` of them; ``widths``: bounds on ``count`` of each side (None: read,
    one host sync)."""
    B = num_sequences
    keep = codes >= 0
    count = torch.zeros(2 * B, dtype=torch.long, device=codes.device).index_add_(0, rows, keep.long())
    if widths is None:
        widths = count.view(2, B).amax(1).tolist() if B else [0, 0]
    before = (count.cumsum(0) - count).index_select(0, rows)  # the entries of the rows before
    pos = torch.where(keep, keep.cumsum(0) - before, 0)  # from 1 in its row; 0: no entry
    out = torch.full((2 * B, max(widths) + 1), -1, dtype=torch.long, device=codes.device)
    return out.index_put_((rows, pos), codes), count, [int(x) for x in widths]  # no entry: to column 0


def movement_with_misses_sums(batch: EventBatch, extras: Optional[dict] = None) -> torch.Tensor:
    """[7 + SUM_PARTS] float64 (time pairing), over the valid true mouse events with (dx, dy) != (0, 0), p = the
    paired generated event's (dx, dy) or (0, 0): sum |p - t|², sum tx, ty, tx², ty², events (integers), sum
    cos(p, t) (0 where p = 0) as `exact_parts` (its bits whatever the order of the batches and ranks), paired."""
    t, p = batch.target, batch.pred
    paired = batch.time_matching.paired >= 0
    tx, ty, px, py = (x.double() for x in (t.dx, t.dy, torch.where(paired, p.dx, 0), torch.where(paired, p.dy, 0)))
    moved = (t.status == int(Status.VALID)) & _mouse(t) & ((tx != 0) | (ty != 0))
    norms = (px * px + py * py).sqrt() * (tx * tx + ty * ty).sqrt()
    cosine = torch.where(norms > 0, (px * tx + py * ty) / norms.clamp(min=1e-300), 0.0)
    values = torch.cat([torch.stack([(px - tx) ** 2 + (py - ty) ** 2, tx, ty, tx * tx, ty * ty, torch.ones_like(tx)], 1),
                        exact_parts(cosine), paired.double()[:, None]], 1)
    return per_group(values * moved[:, None], batch.seq_idx, extras or {})  # by group of sequences: [groups, 7 + SUM_PARTS]
