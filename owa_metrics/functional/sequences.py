"""What a generated sequence does (generation): where the cursor ends up, what keys get typed, whether the mouse moved.

Read from a decoded `EventBatch`: its target rows and every generated event (``batch.generated``). Per sequence, each
side's valid events in order; the cursor path P(k) is the running sum of the (dx, dy) of its mouse events through its
k-th valid event, in raw device units (``_mu``), from the first event that ``update`` sees (the callback passes the
continuation after the prompt). At a true event k, P_gen is the generated path through its first min(k, n_gen) valid
events (``pairing="index"``), or over its valid events whose absolute time is <= the true event's (``"time"``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..decode import kernel
from ..decode.event_batch import EventBatch, EventFields
from ..schema import Category, Status

BUTTON_DOWN = 0x001 | 0x004 | 0x010  # button_flags of a left, right or middle button going down


def _valid(fields: EventFields, seq: torch.Tensor, category=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, rows) of the valid events (of ``category``: one, or a tuple of them), in (row, position) order."""
    keep = fields.status == int(Status.VALID)
    if category is not None:
        keep &= torch.isin(fields.category, torch.tensor(category, device=keep.device))
    at = keep.nonzero().squeeze(1)
    return at, seq.index_select(0, at).long()


def _starts(rows: torch.Tensor, num_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's first index in a list sorted by row, and its count."""
    count = torch.zeros(num_sequences, dtype=torch.long, device=rows.device).index_add_(0, rows, torch.ones_like(rows))
    return count.cumsum(0) - count, count


def _generated(batch: EventBatch) -> tuple[EventFields, torch.Tensor]:
    if batch.generated is None:
        raise ValueError("this EventBatch has no generated side (EventBatch.generated): decode it with "
                         "decode_batch(preds, target, vocab, alignment='generation')")
    return batch.generated, batch.generated_seq


def _path(fields: EventFields, at: torch.Tensor) -> torch.Tensor:
    """[len(at) + 1, 2]: 0, then the running sum of the mouse events' (dx, dy) over ``at`` (int64: exact)."""
    mouse = (fields.category == int(Category.MOUSE_OP)) | (fields.category == int(Category.MOUSE_NOP))
    xy = (torch.stack([fields.dx, fields.dy], 1) * mouse[:, None]).index_select(0, at)
    return torch.cat([xy.new_zeros(1, 2), xy.cumsum(0)])


def cursor_offsets(batch: EventBatch, extras: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clicks, ends)``: d = |P_gen - P_true| (Euclidean, raw units) at each true button-down event (`BUTTON_DOWN`)
    and at the last valid true event of each sequence with a valid true mouse event. Kept in ``extras`` (one update)."""
    if "cursor_offsets" in extras:
        return extras["cursor_offsets"]
    target, (generated, g_seq) = batch.target, _generated(batch)
    B = batch.num_sequences
    t_at, t_row = _valid(target, batch.seq_idx)
    g_at, g_row = _valid(generated, g_seq)
    t_start, t_count = _starts(t_row, B)
    g_start, g_count = _starts(g_row, B)
    first_t, first_g = t_start.index_select(0, t_row), g_start.index_select(0, t_row)
    k = torch.arange(1, len(t_at) + 1, device=t_at.device) - first_t  # the rank among the row's valid true events
    if batch.time_matching is None:
        taken = torch.minimum(k, g_count.index_select(0, t_row))
    else:  # per row, the generated events at times <= the true event's: one search over (row, time rank) keys
        t_ns, g_ns = batch.time_matching.target_ns.index_select(0, t_at), batch.time_matching.generated_ns[g_at]
        times, rank = torch.unique(torch.cat([g_ns, t_ns]), return_inverse=True)
        g_key, t_key = g_row * len(times) + rank[:len(g_at)], t_row * len(times) + rank[len(g_at):]
        g_key, order = torch.sort(g_key, stable=True)  # rows stay in order: the row starts hold
        g_at = g_at.index_select(0, order)
        taken = torch.searchsorted(g_key, t_key, right=True) - first_g
    p_true, p_gen = _path(target, t_at), _path(generated, g_at)
    gap = (p_gen.index_select(0, first_g + taken) - p_gen.index_select(0, first_g)) - (
        p_true[1:] - p_true.index_select(0, first_t))
    d = gap.double().pow(2).sum(1).sqrt()
    clicks = d[(target.button_flags.index_select(0, t_at) & BUTTON_DOWN) != 0]
    mouse = _valid(target, batch.seq_idx, (int(Category.MOUSE_OP), int(Category.MOUSE_NOP)))[1]
    with_mouse = torch.zeros(B, dtype=torch.bool, device=d.device).index_fill_(0, mouse, True)
    ends = d.index_select(0, (t_start + t_count - 1)[with_mouse & (t_count > 0)])
    extras["cursor_offsets"] = clicks, ends
    return clicks, ends


def key_sequence_sums(batch: EventBatch) -> torch.Tensor:
    """[4] float64: sum over rows of Levenshtein(generated keys, true keys), the true keys, rows whose keys are equal
    and rows with a true key; a key = (vk, press/release) of a valid keyboard event, in order."""
    (generated, g_seq), B = _generated(batch), batch.num_sequences
    sides = []
    for fields, seq in ((batch.target, batch.seq_idx), (generated, g_seq)):
        at, rows = _valid(fields, seq, (int(Category.KEYBOARD),))
        sides.append((fields.vk.index_select(0, at) * 2 + fields.action.index_select(0, at), rows))
    distance = levenshtein(*sides[0], *sides[1], B)
    length = _starts(sides[0][1], B)[1]
    return torch.stack([distance.sum(), length.sum(), ((distance == 0) & (length > 0)).sum(), (length > 0).sum()]).double()


def levenshtein(a: torch.Tensor, a_row: torch.Tensor, b: torch.Tensor, b_row: torch.Tensor,
                num_sequences: int) -> torch.Tensor:
    """[num_sequences]: the edit distance (insertions, deletions, substitutions, each 1) between each row's codes of
    ``a`` and of ``b`` (both sorted by row). CPU tensors: one compiled loop (numba); elsewhere `levenshtein_torch`."""
    if a.device.type == "cpu" and kernel.available():
        a_start, b_start = (torch.cat([row.new_zeros(1), _starts(row, num_sequences)[1].cumsum(0)]).numpy()
                            for row in (a_row, b_row))
        out = np.zeros(num_sequences, dtype=np.int64)
        _levenshtein_rows(a.numpy(), a_start, b.numpy(), b_start, out)
        return torch.from_numpy(out)
    return levenshtein_torch(a, a_row, b, b_row, num_sequences)


def levenshtein_torch(a, a_row, b, b_row, num_sequences: int) -> torch.Tensor:
    """`levenshtein` in torch ops: the rows padded to [B, M] and [B, N], then M steps of the dynamic programme over
    all rows at once (M: the longest row of ``a``; one host read of it). Step i: E[j] = min(D[j] + 1, D[j - 1] +
    (a_i != b_j)), E[0] = i, and D'[j] = min over k <= j of E[k] + j - k, one ``cummin``."""
    rows = []
    for codes, row in ((a, a_row), (b, b_row)):
        start, count = _starts(row, num_sequences)
        pos = torch.arange(len(row), device=row.device) - start.index_select(0, row)
        width = int(count.max()) if len(count) else 0
        rows.append((torch.full((num_sequences, width), -1, dtype=torch.long, device=row.device).index_put_(
            (row, pos), codes.long()), count))
    (A, a_len), (G, g_len) = rows
    j = torch.arange(G.shape[1] + 1, device=G.device)
    D = j.expand(num_sequences, -1)
    for i in range(1, A.shape[1] + 1):
        E = torch.minimum(D[:, 1:] + 1, D[:, :-1] + (A[:, i - 1:i] != G))
        E = torch.cat([torch.full_like(D[:, :1], i), E], 1)
        D = torch.where((i <= a_len)[:, None], torch.cummin(E - j, 1).values + j, D)
    return D.gather(1, g_len[:, None]).squeeze(1)


@kernel._jit
def _levenshtein_rows(a, a_start, b, b_start, out):
    for r in range(out.shape[0]):
        n = b_start[r + 1] - b_start[r]
        previous = np.arange(n + 1)
        current = np.empty(n + 1, np.int64)
        for i in range(a_start[r], a_start[r + 1]):
            current[0] = i - a_start[r] + 1
            for j in range(1, n + 1):
                cost = 0 if a[i] == b[b_start[r] + j - 1] else 1
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            previous, current = current, previous
        out[r] = previous[n]


def movement_with_misses_sums(batch: EventBatch) -> torch.Tensor:
    """[8] float64 (time pairing), over the valid true mouse events with (dx, dy) != (0, 0), p = the paired generated
    event's (dx, dy) or (0, 0): sum |p - t|², sum tx, ty, tx², ty², events, sum cos(p, t) (0 where p = 0), paired."""
    t, p = batch.target, batch.pred
    paired = batch.time_matching.paired >= 0
    tx, ty, px, py = (x.double() for x in (t.dx, t.dy, torch.where(paired, p.dx, 0), torch.where(paired, p.dy, 0)))
    moved = ((t.status == int(Status.VALID)) & ((t.category == int(Category.MOUSE_OP))
                                                 | (t.category == int(Category.MOUSE_NOP))) & ((tx != 0) | (ty != 0)))
    norms = (px * px + py * py).sqrt() * (tx * tx + ty * ty).sqrt()
    cosine = torch.where(norms > 0, (px * tx + py * ty) / norms.clamp(min=1e-300), 0.0)
    values = torch.stack([(px - tx) ** 2 + (py - ty) ** 2, tx, ty, tx * tx, ty * ty, torch.ones_like(tx), cosine,
                          paired.double()], 1)
    return (values * moved[:, None]).sum(0)
