"""The compiled CPU twin of `OWAEventMetrics`' accumulation: every additive state from decoded events in one loop.

`accumulate` walks the rows of a decoded batch (`owa_metrics.decode.kernel.decode_arrays`) once and adds to the
metric's states in place (numpy views of its float64 tensors) what `event_type_sums`, `keyboard_sums`,
`mouse_action_sums`, `movement_sums`, `digit_precision_sums` and the timestamp digit groups add on the torch
path, and writes the exact samples of the comparable rows (`TIMESTAMP_COLUMNS`, `MOUSE_COLUMNS`) into flat
buffers. `token_stats` does what `event_token_stats` + `token_sums` do. The definitions are those functions';
the tests hold both paths equal. Counts are exact; the per-sequence means (a sum of ratios) may differ from
torch's vectorized sum in the last bit. The direction error needs ``atan2``: the kernel writes its arguments
and `direction_deg` finishes with torch's ``atan2`` (numba's libm ``atan2`` differs from torch's in the last
bit for ~3 % of the inputs).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..decode.kernel import INVALID_CAT, KEYBOARD_CAT, MOUSE_NOP_CAT, MOUSE_OP_CAT, TYPE_MISMATCH, VALID, _jit
from ..schema import CATEGORY_NAMES, KIND_CATEGORY as _KIND_CATEGORY

KIND_CATEGORY = np.array(_KIND_CATEGORY, dtype=np.int64)
N_CAT = len(CATEGORY_NAMES)
CODE_NAMES = ("VALID", "TYPE_MISMATCH", "INVALID_CAT", "KEYBOARD_CAT", "MOUSE_OP_CAT", "MOUSE_NOP_CAT", "N_CAT")


@_jit
def compiled_codes():
    """`CODE_NAMES`' values as the compiled (possibly cached) kernels of this module hold them."""
    return VALID, TYPE_MISMATCH, INVALID_CAT, KEYBOARD_CAT, MOUSE_OP_CAT, MOUSE_NOP_CAT, N_CAT


@_jit
def _prefix_matches(p_digits, t_digits, i, first, count, out_row, out):
    """Add 1 to ``out[out_row, j]`` for every level j whose digits 1..j all match (digits ``first`` .. +count)."""
    for j in range(count):
        if p_digits[i, first + j] != t_digits[i, first + j]:
            return
        out[out_row, j] += 1


@_jit
def accumulate(seq, status, t_status, t_kind, t_values, t_digits, p_kind, p_values, p_digits, t_counts, p_counts,
               n_ts, n_delta, window_ns, kind_category, confusion, statuses, target_statuses, counts, ts_digits,
               mouse_digits, keyboard, mouse_action, movement, ts_rows, mouse_rows, angle_args):
    """Add one decoded batch to the states; returns ``(timestamp rows, mouse rows)`` written to the buffers.

    ``ts_rows`` [N, 3]: (signed error ms, percent error, category) of each comparable row; ``mouse_rows`` [N, 4]:
    (euclidean PE, signed PE x, signed PE y, NaN) of each comparable mouse row, ``angle_args`` [2, 2 N]: the
    ``atan2`` arguments (y, x) of its predicted then true vector (see `direction_deg`).
    """
    n, B = seq.shape[0], t_counts.shape[0]
    valid_per_seq, hits = np.zeros(B), np.zeros(B)
    keys_per_seq, key_hits = np.zeros(B), np.zeros(B)
    half = window_ns // 2
    m_ts, m_mouse = 0, 0
    for i in range(n):
        s = status[i]
        statuses[s] += 1
        target_statuses[t_status[i]] += 1
        if t_status[i] != VALID:
            continue
        b, cat = seq[i], min(t_values[i, 0], N_CAT - 1)
        typed = p_values[i, 0]
        if s == TYPE_MISMATCH and typed == INVALID_CAT:  # an undecodable mismatch counts in its type token's column
            typed = kind_category[max(p_kind[i], 0)]
        confusion[cat, typed] += 1
        valid_per_seq[b] += 1
        if s != VALID:
            continue
        hits[b] += 1
        # timestamp: wrap-aware signed error ((p - t + W/2) mod W) - W/2, percent of the true timestamp
        signed_ms = ((p_values[i, 1] - t_values[i, 1] + half) % window_ns - half) / 1e6
        target_ms = t_values[i, 1] / 1e6
        ts_rows[m_ts, 0] = signed_ms
        ts_rows[m_ts, 1] = abs(signed_ms) / abs(target_ms) * 100 if target_ms != 0 else np.nan
        ts_rows[m_ts, 2] = cat
        m_ts += 1
        _prefix_matches(p_digits, t_digits, i, 0, n_ts, 0, ts_digits)
        _prefix_matches(p_digits, t_digits, i, 0, n_ts, 1 + cat, ts_digits)
        ts_digits[0, n_ts] += 1
        ts_digits[1 + cat, n_ts] += 1
        if cat == KEYBOARD_CAT:
            vk, action = p_values[i, 2] == t_values[i, 2], p_values[i, 3] == t_values[i, 3]
            keyboard[0] += vk
            keyboard[1] += action
            keyboard[2] += vk and action
            keyboard[3] += 1
            keys_per_seq[b] += 1
            key_hits[b] += vk and action
        elif cat == MOUSE_OP_CAT or cat == MOUSE_NOP_CAT:
            px, py, gx, gy = float(p_values[i, 4]), float(p_values[i, 5]), float(t_values[i, 4]), float(t_values[i, 5])
            norm = math.sqrt(gx * gx + gy * gy)
            ex, ey = px - gx, py - gy
            mouse_rows[m_mouse, 0] = math.sqrt(ex * ex + ey * ey) / norm * 100 if norm != 0 else np.nan
            mouse_rows[m_mouse, 1] = ex / gx * 100 if gx != 0 else np.nan
            mouse_rows[m_mouse, 2] = ey / gy * 100 if gy != 0 else np.nan
            angle_args[0, 2 * m_mouse], angle_args[1, 2 * m_mouse] = py, px
            angle_args[0, 2 * m_mouse + 1], angle_args[1, 2 * m_mouse + 1] = gy, gx
            m_mouse += 1
            flags, data = t_values[i, 6], t_values[i, 7]
            if flags != 0:
                mouse_action[0] += p_values[i, 6] == flags
                mouse_action[1] += 1
            if data != 0:
                mouse_action[2] += p_values[i, 7] == data
                mouse_action[3] += 1
            movement[0] += ex * ex + ey * ey
            movement[1] += gx
            movement[2] += gy
            movement[3] += gx * gx
            movement[4] += gy * gy
            movement[5] += 1
            _prefix_matches(p_digits, t_digits, i, n_ts, n_delta, 0, mouse_digits)
            _prefix_matches(p_digits, t_digits, i, n_ts + n_delta, n_delta, 1, mouse_digits)
            for j in range(n_delta):  # both components through level j
                x, y = n_ts + j, n_ts + n_delta + j
                if p_digits[i, x] != t_digits[i, x] or p_digits[i, y] != t_digits[i, y]:
                    break
                mouse_digits[2, j] += 1
            mouse_digits[0, n_delta] += 1
            mouse_digits[1, n_delta] += 1
            mouse_digits[2, n_delta] += 1
    counts[0] += n
    counts[1] += B
    for b in range(B):
        counts[2] += p_counts[b] == t_counts[b]
        counts[3] += p_counts[b]
        counts[4] += max(p_counts[b] - t_counts[b], 0)
        counts[5] += max(t_counts[b] - p_counts[b], 0)
        if valid_per_seq[b] > 0:
            counts[6] += hits[b] / valid_per_seq[b]
            counts[7] += 1
        if keys_per_seq[b] > 0:
            keyboard[4] += key_hits[b] / keys_per_seq[b]
            keyboard[5] += 1
    return m_ts, m_mouse


@_jit
def token_stats(seq, t_status, t_kind, t_values, start, end, start_cut, T, labels, guesses, field_table, token_loss,
                has_loss, fields, loss):
    """Teacher forcing, per valid target event: each field token (``field_table`` [kind, slot], slot 0 =
    ``<EVENT_START>``) right or not into ``fields`` [2, F]; with ``has_loss`` the summed ``token_loss`` over the
    event's span (prefix sums, as the torch path) and one event into ``loss`` [2, categories] by category."""
    n_slots = field_table.shape[1] - 1
    cumulative = np.zeros(1)
    if has_loss:
        cumulative = np.zeros(token_loss.shape[0] + 1)
        for k in range(token_loss.shape[0]):
            cumulative[k + 1] = cumulative[k] + token_loss[k]
    for i in range(seq.shape[0]):
        if t_status[i] != VALID:
            continue
        row = seq[i] * T
        first, last = row + start[i], row + end[i]
        slot0 = first - (1 if start_cut[i] else 0)
        for s in range(n_slots):
            pos = slot0 + s
            field = field_table[t_kind[i], s]
            if pos > last or field < 0:
                continue
            label = labels[min(max(pos, 0), labels.shape[0] - 1)]
            if label >= 0:
                fields[1, field] += 1
                fields[0, field] += guesses[min(max(pos, 0), labels.shape[0] - 1)] == label
        if has_loss:
            cat = t_values[i, 0]
            loss[0, cat] += cumulative[last + 1] - cumulative[first]
            loss[1, cat] += 1


def direction_deg(angle_args: np.ndarray, m: int) -> np.ndarray:
    """Direction error of the ``m`` mouse rows from `accumulate`'s ``atan2`` arguments:
    ``min(|θp - θg|, 360 - |θp - θg|)`` in degrees (torch's ``atan2``, as `direction_error_deg`; NaN where g = 0)."""
    args = torch.from_numpy(angle_args[:, :2 * m])
    theta = torch.atan2(args[0], args[1]).numpy()
    out = np.empty(m)
    _direction(theta, angle_args, out)
    return out


@_jit
def _direction(theta, angle_args, out):
    for k in range(out.shape[0]):
        delta = abs(theta[2 * k] - theta[2 * k + 1])
        defined = angle_args[0, 2 * k + 1] != 0 or angle_args[1, 2 * k + 1] != 0
        out[k] = min(delta, 2 * math.pi - delta) * (180 / math.pi) if defined else np.nan
