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

from ..decode.event_batch import VALUE_COLUMNS, EventBatch, EventFields
from ..schema import Category, Status
from .declare import per_group

BUTTON_DOWN = 0x001 | 0x004 | 0x010  # button_flags of a left, right or middle button going down
DX = VALUE_COLUMNS.index("dx")  # then dy


def _generated(batch: EventBatch) -> tuple[EventFields, torch.Tensor]:
    if batch.generated is None:
        raise ValueError("this EventBatch has no generated side (EventBatch.generated): decode it with "
                         "decode_batch(preds, target, vocab, alignment='generation')")
    return batch.generated, batch.generated_seq.long()


def _mouse(fields: EventFields) -> torch.Tensor:
    """Valid mouse events (an event that does not decode has category INVALID)."""
    return (fields.category == int(Category.MOUSE_OP)) | (fields.category == int(Category.MOUSE_NOP))


def _counts(rows: torch.Tensor, weights: torch.Tensor, num_sequences: int) -> torch.Tensor:
    """Per sequence, the sum of ``weights`` (int64) over its entries."""
    return torch.zeros(num_sequences, dtype=torch.long, device=rows.device).index_add_(0, rows, weights.long())


def cursor_offsets(batch: EventBatch, extras: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clicks [n_target_events], ends [num_sequences])``: d = |P_gen - P_true| (Euclidean, raw units) at each valid
    true button-down event (`BUTTON_DOWN`; NaN at the other rows), and at the last valid true event of each sequence
    with a valid true mouse event (NaN for the others). Kept in ``extras`` (one update reads it twice)."""
    if "cursor_offsets" in extras:
        return extras["cursor_offsets"]
    target, (generated, g_row) = batch.target, _generated(batch)
    B, t_row, N, M = batch.num_sequences, batch.seq_idx.long(), len(batch.target.status), len(g_row)
    t_ok, g_ok = target.status == int(Status.VALID), generated.status == int(Status.VALID)
    mouse = [_mouse(f) for f in (target, generated)]
    moves = [f.values[:, DX:DX + 2] * m[:, None] for f, m in zip((target, generated), mouse)]  # 0 unless mouse
    if batch.time_matching is None:  # the key: how many valid events of its side so far
        t_key, g_key = (_row_cumsum(ok.long()[:, None], row, B)[:, 0] for ok, row in ((t_ok, t_row), (g_ok, g_row)))
    else:
        t_key, g_key = batch.time_matching.target_ns, batch.time_matching.generated_ns
    # both sides by (row, key), generated first on ties: the running generated path at each true event holds the
    # generated events of the rows before it and of its row with key <= its key (an invalid event adds 0)
    row, key = torch.cat([g_row, t_row]), torch.cat([g_key, t_key]) * 2 + (torch.arange(M + N, device=t_row.device) >= M)
    order = torch.argsort(key, stable=True)
    order = order.index_select(0, torch.argsort(row.index_select(0, order), stable=True))
    running = torch.cat([moves[1], moves[1].new_zeros(N, 2)]).index_select(0, order).cumsum(0)
    at = torch.empty_like(order).index_copy_(0, order, torch.arange(M + N, device=order.device))[M:]
    rows_before = _row_cumsum(moves[1], g_row, B, exclusive_totals=True).index_select(0, t_row)
    gap = running.index_select(0, at) - rows_before - _row_cumsum(moves[0], t_row, B)
    d = gap.double().pow(2).sum(1).sqrt()
    nan = torch.full_like(d, float("nan"))
    clicks = torch.where(t_ok & ((target.button_flags & BUTTON_DOWN) != 0), d, nan)
    last = torch.full((B,), -1, dtype=torch.long, device=d.device).scatter_reduce(
        0, t_row, torch.where(t_ok, torch.arange(N, device=d.device), -1), "amax")
    with_mouse = _counts(t_row, mouse[0], B) > 0
    ends = torch.where(with_mouse, torch.cat([d, d.new_zeros(1)]).index_select(0, last.clamp(min=0)), float("nan"))
    extras["cursor_offsets"] = clicks, ends
    return clicks, ends


def _row_cumsum(x: torch.Tensor, rows: torch.Tensor, num_sequences: int, exclusive_totals: bool = False) -> torch.Tensor:
    """The running sum of ``x`` [n, c] along each sequence (entries sorted by row), restarted at each row; or, with
    ``exclusive_totals``, per sequence the total of the rows before it [num_sequences, c]."""
    totals = torch.zeros((num_sequences, x.shape[1]), dtype=x.dtype, device=x.device).index_add_(0, rows, x)
    before = totals.cumsum(0) - totals
    return before if exclusive_totals else x.cumsum(0) - before.index_select(0, rows)


def key_sequence_sums(batch: EventBatch, extras: Optional[dict] = None) -> torch.Tensor:
    """[4] float64: sum over rows of Levenshtein(generated keys, true keys), the true keys, rows whose keys are equal
    and rows with a true key; a key = (vk, press/release) of a valid keyboard event, in order ([groups, 4] by group of
    sequences with ``extras["group"]``: `per_group`)."""
    (generated, g_row), B = _generated(batch), batch.num_sequences
    codes = [torch.where((f.status == int(Status.VALID)) & (f.category == int(Category.KEYBOARD)), f.vk * 2 + f.action,
                         -1) for f in (batch.target, generated)]
    t_row = batch.seq_idx.long()
    distance = levenshtein(codes[0], t_row, codes[1], g_row, B)
    length = _counts(t_row, codes[0] >= 0, B)
    if extras is None or extras.get("group") is None:
        return torch.stack([distance.sum(), length.sum(), ((distance == 0) & (length > 0)).sum(),
                            (length > 0).sum()]).double()
    rows = torch.stack([distance, length, (distance == 0) & (length > 0), length > 0], 1).double()
    return per_group(rows, torch.arange(B, device=rows.device), extras)


def levenshtein(a: torch.Tensor, a_row: torch.Tensor, b: torch.Tensor, b_row: torch.Tensor,
                num_sequences: int) -> torch.Tensor:
    """[num_sequences]: per row, the edit distance (insertions, deletions, substitutions, each 1) between its codes of
    ``a`` and of ``b`` (entries sorted by row; negative codes are no entries). Exact and bit-parallel (rapidfuzz's
    Levenshtein over the rows' code lists: O(n m / 64), not a full table), on the CPU: tensors elsewhere are copied
    there at once (one host sync). `levenshtein_torch` is the same in torch ops."""
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
    return torch.tensor(out, dtype=torch.long, device=a.device)


def levenshtein_torch(a, a_row, b, b_row, num_sequences: int) -> torch.Tensor:
    """`levenshtein` in torch ops: each side's entries packed into [B, width] (one host read of the widths), then one
    step of the dynamic programme per position of ``a`` over all rows at once: E[j] = min(D[j] + 1, D[j - 1] +
    (a_i != b_j)), E[0] = i, and D'[j] = min over k <= j of E[k] + j - k (insertions: one ``cummin``)."""
    packed = []
    for codes, row in ((a, a_row), (b, b_row)):
        keep = (codes >= 0).long()
        pos = _row_cumsum(keep[:, None], row, num_sequences)[:, 0] - 1
        packed.append((codes, row, pos, _counts(row, keep, num_sequences)))
    widths = torch.stack([p[3].max() if num_sequences else p[3].new_zeros(()) for p in packed]).tolist()
    (A, a_len), (G, g_len) = ((torch.full((num_sequences, w + 1), -1, dtype=torch.long, device=a.device).index_put_(
        (row, torch.where(codes >= 0, pos, w)), codes.long())[:, :w], count)
        for (codes, row, pos, count), w in zip(packed, widths))
    j = torch.arange(G.shape[1] + 1, device=G.device)
    D = j.expand(num_sequences, -1)
    for i in range(1, A.shape[1] + 1):
        E = torch.minimum(D[:, 1:] + 1, D[:, :-1] + (A[:, i - 1:i] != G))
        E = torch.cat([torch.full_like(D[:, :1], i), E], 1)
        D = torch.where((i <= a_len)[:, None], torch.cummin(E - j, 1).values + j, D)
    return D.gather(1, g_len[:, None]).squeeze(1)


def movement_with_misses_sums(batch: EventBatch, extras: Optional[dict] = None) -> torch.Tensor:
    """[8] float64 (time pairing), over the valid true mouse events with (dx, dy) != (0, 0), p = the paired generated
    event's (dx, dy) or (0, 0): sum |p - t|², sum tx, ty, tx², ty², events, sum cos(p, t) (0 where p = 0), paired."""
    t, p = batch.target, batch.pred
    paired = batch.time_matching.paired >= 0
    tx, ty, px, py = (x.double() for x in (t.dx, t.dy, torch.where(paired, p.dx, 0), torch.where(paired, p.dy, 0)))
    moved = (t.status == int(Status.VALID)) & _mouse(t) & ((tx != 0) | (ty != 0))
    norms = (px * px + py * py).sqrt() * (tx * tx + ty * ty).sqrt()
    cosine = torch.where(norms > 0, (px * tx + py * ty) / norms.clamp(min=1e-300), 0.0)
    values = torch.stack([(px - tx) ** 2 + (py - ty) ** 2, tx, ty, tx * tx, ty * ty, torch.ones_like(tx), cosine,
                          paired.double()], 1)
    return per_group(values * moved[:, None], batch.seq_idx, extras or {})  # by group of sequences: [groups, 8]
