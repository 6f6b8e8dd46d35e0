"""The compiled CPU path of `OWAEventMetrics`' accumulation: the report's plan run in one loop over the rows.

`accumulate` reads the tables that `owa_metrics.functional.plan` derives from the declarations (the key, the code
values and groups by key, the matches, the number program, the cells each key adds to) and adds what the torch
path's ``G^T X`` adds, row by row, without a per-metric line: a new declaration needs no change here. The tests
hold both paths equal (counts exactly; sums of ratios and the direction error, whose ``atan2`` is numba's libm's,
to the last bits). `token_stats` does what `event_token_stats` + `token_sums` do.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from ..decode.kernel import VALID, _jit
from .declare import PART_SCALE, SUM_PARTS
from .plan import N_CAT, OPS, Plan, compiled_tables
from .stats import SketchSpec, sketch_counts

NUMBER, ADD, SUB, MUL, ABS, ROOTPCT, MS, WRAP, PCT, DIRECTION, WITHIN = (OPS.index(op) for op in OPS)
CODE_NAMES = ("VALID",)
OP_NAMES = ("NUMBER", "ADD", "SUB", "MUL", "ABS", "ROOTPCT", "MS", "WRAP", "PCT", "DIRECTION", "WITHIN")
MASK_COLUMNS = 63  # `_accumulate` tests the matches with bit masks when V has at most this many columns
# the plan's tables (`plan.compiled_tables`) in `_accumulate`'s order
TABLES = ("key_columns", "key_weights", "key_offsets", "coded", "groups", "match_ptr", "match_column", "match_sign",
          "read_ptr", "read_match", "run_ptr", "run", "code", "sum_regs", "sample_regs", "n_regs", "const_ptr",
          "const_cell", "const_value", "cell_ptr", "cell_flat", "cell_x", "seq_groups", "seq_values", "sample_groups",
          "sample_offsets")


@_jit
def compiled_codes():
    """`CODE_NAMES`' values as the compiled (possibly cached) kernels of this module hold them."""
    return (VALID,)


@_jit
def compiled_ops():
    """`OP_NAMES`' values as the compiled (possibly cached) kernels of this module hold them."""
    return NUMBER, ADD, SUB, MUL, ABS, ROOTPCT, MS, WRAP, PCT, DIRECTION, WITHIN


@_jit
def _run(code, run, v, window_ns, reg):
    """The instructions ``run`` of the number program over one row ``v`` of V into ``reg``."""
    half = window_ns // 2
    for k in run:
        op, dst, a, b, c, d = code[k, 0], code[k, 1], code[k, 2], code[k, 3], code[k, 4], code[k, 5]
        if op == NUMBER:
            reg[dst] = float(v[a])
        elif op == ADD:
            reg[dst] = reg[a] + reg[b]
        elif op == SUB:
            reg[dst] = reg[a] - reg[b]
        elif op == MUL:
            reg[dst] = reg[a] * reg[b]
        elif op == ABS:
            reg[dst] = abs(reg[a])
        elif op == ROOTPCT:
            reg[dst] = math.sqrt(reg[a] / reg[b] * 100 * 100) if reg[b] != 0 else np.nan
        elif op == MS:
            reg[dst] = reg[a] / 1e6
        elif op == WRAP:
            reg[dst] = (reg[a] + half) % window_ns - half
        elif op == PCT:
            reg[dst] = reg[a] / reg[b] * 100 if reg[b] != 0 else np.nan
        elif op == DIRECTION:
            if reg[c] != 0 or reg[d] != 0:
                delta = abs(math.atan2(reg[b], reg[a]) - math.atan2(reg[d], reg[c]))
                reg[dst] = min(delta, 2 * math.pi - delta) * (180 / math.pi)
            else:
                reg[dst] = np.nan
        elif op == WITHIN:
            reg[dst] = 1.0 if b <= reg[a] <= c else 0.0


@_jit
def _accumulate(status, t_status, t_values, t_digits, p_kind, p_values, p_digits, seq, t_counts, p_counts, window_ns,
                key_columns, key_weights, key_offsets, coded, groups, match_ptr, match_column, match_sign, read_ptr,
                read_match, run_ptr, run, code, sum_regs, sample_regs, n_regs, const_ptr, const_cell, const_value, cell_ptr,
                cell_flat, cell_x, seq_groups, seq_values, sample_groups, sample_offsets, seq_group, sums, seq_out,
                batch_out, sample_rows, sample_group, sample_counts, bit_masks):
    """Each row's V (`plan.row_columns`), its key, values and cells, as `plan.accumulate` with torch ops, into the
    block of its sequence's group (``seq_group`` [B]): ``sums`` [G, cells], ``seq_out`` [G, (1 + SUM_PARTS) S] (the
    sequences with any, then each sum of means as `exact_parts`: the same ops), ``batch_out`` [G, 5];
    each sampled row's group in ``sample_group``. ``bit_masks`` (V of at most `MASK_COLUMNS` columns): test each match
    with two bit masks over V's columns, else condition by condition."""
    n_coded, n_match = coded.shape[1], match_ptr.shape[0] - 1
    B, S = t_counts.shape[0], seq_groups.shape[0]
    x = np.zeros(n_coded + n_match)  # [coded values (never written: `coded` holds them), matches]
    reg = np.zeros(max(n_regs, 1))
    seq_n, seq_x = np.zeros((B, S)), np.zeros((B, S))
    n_values, n_digits = t_values.shape[1], t_digits.shape[1]
    v = np.zeros(3 * n_values + n_digits + 3, np.int64)
    # each match as two bit masks over V's columns: those it needs zero, and nonzero (a branch per condition
    # mispredicts: they fail at random; the masks test a match at once)
    zero_mask, nonzero_mask = np.zeros(n_match, np.int64), np.zeros(n_match, np.int64)
    for j in range(n_match):
        for e in range(match_ptr[j], match_ptr[j + 1]):
            bit = np.int64(1) << min(match_column[e], 62)
            if match_sign[e] > 0:
                zero_mask[j] |= bit
            else:
                nonzero_mask[j] |= bit
    # the cells and sequence values that read the program's sums read its registers (-1 - register), not a copy
    base = n_coded + n_match
    source = cell_x.copy()
    for e in range(source.shape[0]):
        if source[e] >= base:
            source[e] = -1 - sum_regs[source[e] - base]
    for i in range(seq.shape[0]):
        for j in range(n_values):
            v[j], v[n_values + j], v[2 * n_values + j] = p_values[i, j] - t_values[i, j], t_values[i, j], p_values[i, j]
        for j in range(n_digits):
            v[3 * n_values + j] = p_digits[i, j] - t_digits[i, j]
        v[-3], v[-2], v[-1] = status[i], t_status[i], p_kind[i]
        key = 0
        for j in range(key_columns.shape[0]):
            key += v[key_columns[j]] * key_weights[j] + key_offsets[j]
        if bit_masks:  # the matches this key's cells read
            bits = np.int64(0)  # V's nonzero columns
            for c in range(v.shape[0]):
                bits |= np.int64(v[c] != 0) << c
            for r in range(read_ptr[key], read_ptr[key + 1]):
                j = read_match[r]
                x[n_coded + j] = 1.0 if (bits & zero_mask[j]) == 0 and (bits & nonzero_mask[j]) == nonzero_mask[j] \
                    else 0.0
        else:
            for r in range(read_ptr[key], read_ptr[key + 1]):
                j = read_match[r]
                ok = 1.0
                for e in range(match_ptr[j], match_ptr[j + 1]):
                    nonzero = v[match_column[e]] != 0
                    if nonzero == (match_sign[e] > 0):
                        ok = 0.0
                        break
                x[n_coded + j] = ok
        if run_ptr[key + 1] > run_ptr[key]:
            _run(code, run[run_ptr[key]:run_ptr[key + 1]], v, window_ns, reg)
        b = seq[i]
        g = seq_group[b]
        for e in range(const_ptr[key], const_ptr[key + 1]):
            sums[g, const_cell[e]] += const_value[e]
        for e in range(cell_ptr[key], cell_ptr[key + 1]):
            c = source[e]
            sums[g, cell_flat[e]] += x[c] if c >= 0 else reg[-1 - c]
        for s in range(S):
            if groups[key, seq_groups[s]] != 0:
                seq_n[b, s] += 1
                c = seq_values[s]
                seq_x[b, s] += coded[key, c] if c < n_coded else x[c] if c < base else reg[sum_regs[c - base]]
        for s in range(sample_groups.shape[0]):
            if groups[key, sample_groups[s]] != 0:
                m = sample_counts[s]
                for j in range(sample_offsets[s], sample_offsets[s + 1]):
                    sample_rows[m, j] = reg[sample_regs[j]]
                sample_group[m, s] = g
                sample_counts[s] = m + 1
    for s in range(S):
        for b in range(B):
            if seq_n[b, s] > 0:  # the sequences with any, then the sum of the means (`plan.accumulate`'s order)
                seq_out[seq_group[b], s] += 1
                mean = seq_x[b, s] / seq_n[b, s]
                for j in range(SUM_PARTS):
                    mean *= PART_SCALE
                    part = np.floor(mean)
                    seq_out[seq_group[b], S + SUM_PARTS * s + j] += part
                    mean -= part
    for b in range(B):
        gap, g = p_counts[b] - t_counts[b], seq_group[b]
        batch_out[g, 0] += 1
        batch_out[g, 1] += gap == 0
        batch_out[g, 2] += p_counts[b]
        batch_out[g, 3] += max(gap, 0)
        batch_out[g, 4] += max(-gap, 0)


def accumulate(plan: Plan, out: dict, sketch: bool, spec: SketchSpec, seq_group: Optional[np.ndarray] = None,
               groups: int = 1) -> tuple[list, list, list]:
    """One decoded batch (`owa_metrics.decode.kernel.decode_arrays`' arrays) in one compiled loop: ``(increments
    [groups, size] of plan.sums_states, then in sketch mode with one group of each `Samples` state (with groups:
    `sketch_by_group`); the exact rows of each `Samples` state; each one's rows' groups)``. ``seq_group`` [B]: each
    sequence's group (None: one group)."""
    t, p = out["target"], out["pred"]
    k = compiled_tables(plan)
    n_x, S = len(plan.x_columns), len(plan.seq_groups)
    B, n = len(out["target_count"]), len(out["seq"])
    seq_group = np.zeros(B, dtype=np.int64) if seq_group is None else seq_group
    sums, batch_out = np.zeros((groups, plan.n_groups * n_x)), np.zeros((groups, 5))
    seq_out = np.zeros((groups, (1 + SUM_PARTS) * S))
    sample_rows = np.empty((n, int(k["sample_offsets"][-1])))
    sample_group = np.empty((n, len(plan.samples)), dtype=np.int64)
    counts = np.zeros(len(plan.samples), dtype=np.int64)
    _accumulate(out["status"], t["status"], t["values"], t["digits"], p["kind"], p["values"], p["digits"], out["seq"],
                out["target_count"], out["pred_count"], plan.shape.window_ns, *(k[name] for name in TABLES), seq_group,
                sums, seq_out, batch_out, sample_rows, sample_group, counts,
                3 * t["values"].shape[1] + t["digits"].shape[1] + 3 <= MASK_COLUMNS)
    flat = np.concatenate([sums, seq_out, batch_out], 1)
    increments = list(torch.from_numpy(flat[:, k["index"]]).split(plan.sizes, 1))[:-1]  # the loop counts the samples
    rows = [torch.from_numpy(sample_rows[:m, k["sample_offsets"][s]:k["sample_offsets"][s + 1]])
            for s, m in enumerate(counts.tolist())]
    row_groups = [torch.from_numpy(sample_group[:m, s]) for s, m in enumerate(counts.tolist())]
    if sketch and groups == 1:
        increments += [sketch[None] for sketch in _sketch(plan, rows, spec)]
    return increments, rows, row_groups


def _cells(plan: Plan, rows: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each `Samples` state's sketched ``(values, rows)`` from its kept rows: each value in the whole group's row of
    the state ([values, 1 + categories when split]), and (split by category) in its true category's."""
    out = []
    for state, r in zip(plan.samples.values(), rows):
        n, n_g = len(state.values), 1 + N_CAT if state.by_category else 1
        first = torch.arange(n) * n_g
        if state.by_category:
            out.append((r[:, :n, None].expand(-1, -1, 2).reshape(-1),
                        torch.stack([first.expand(len(r), -1), first + 1 + r[:, n:].long()], 2).reshape(-1)))
        else:
            out.append((r.reshape(-1), first.expand(len(r), -1).reshape(-1)))
    return out


def _sketch(plan: Plan, rows: list[torch.Tensor], spec: SketchSpec) -> list[torch.Tensor]:
    """Each `Samples` state's sketch counts [values x groups x size] (flat) from its rows, in one count."""
    values, cells, sizes, base = [], [], [], 0
    for state, (v, cell) in zip(plan.samples.values(), _cells(plan, rows)):
        values.append(v)
        cells.append(cell + base)
        sizes.append(len(state.values) * (1 + N_CAT if state.by_category else 1) * spec.size)
        base += sizes[-1] // spec.size
    return list(sketch_counts(torch.cat(values), spec, torch.cat(cells), base).view(-1).split(sizes))


def sketch_by_group(plan: Plan, rows: list[torch.Tensor], row_groups: list[torch.Tensor], spec: SketchSpec,
                    states: list[torch.Tensor]) -> None:
    """With groups of sequences (tags): each `Samples` state's sketch counts added in place into ``states`` [groups,
    values, 1 (+ categories), size], each value in its row's group's rows: one ``index_add_`` per state."""
    for state, (v, cell), g in zip(states, _cells(plan, rows), row_groups):
        per_group = state[0].numel() // spec.size
        width = len(v) // max(len(g), 1)
        bucket = spec.index(torch.nan_to_num(v)) + (cell + g.repeat_interleave(width) * per_group) * spec.size
        state.view(-1).index_add_(0, bucket, (~torch.isnan(v)).double())


@_jit
def token_stats(seq, t_status, t_kind, t_values, start, end, start_cut, T, labels, guesses, field_table, token_loss,
                has_loss, seq_group, fields, loss):
    """Teacher forcing, per valid target event: each field token (``field_table`` [kind, slot], slot 0 =
    ``<EVENT_START>``) right or not into ``fields`` [G, 2, F]; with ``has_loss`` the summed ``token_loss`` over the
    event's span (prefix sums, as the torch path) into ``loss`` [G, categories] by category; G: the group of the
    event's sequence (``seq_group``)."""
    n_slots = field_table.shape[1] - 1
    cumulative = np.zeros(1)
    if has_loss:
        cumulative = np.zeros(token_loss.shape[0] + 1)
        for k in range(token_loss.shape[0]):
            cumulative[k + 1] = cumulative[k] + token_loss[k]
    for i in range(seq.shape[0]):
        if t_status[i] != VALID:
            continue
        row, g = seq[i] * T, seq_group[seq[i]]
        first, last = row + start[i], row + end[i]
        slot0 = first - (1 if start_cut[i] else 0)
        for s in range(n_slots):
            pos = slot0 + s
            field = field_table[t_kind[i], s]
            if pos > last or field < 0:
                continue
            label = labels[min(max(pos, 0), labels.shape[0] - 1)]
            if label >= 0:
                fields[g, 1, field] += 1
                fields[g, 0, field] += guesses[min(max(pos, 0), labels.shape[0] - 1)] == label
        if has_loss:
            loss[g, t_values[i, 0]] += cumulative[last + 1] - cumulative[first]
