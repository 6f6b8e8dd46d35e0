"""From the declarations to the tables both accumulation paths read, and the torch path itself.

A decoded batch is a matrix of integers V [N, columns] (`row_columns`: p - t, t and p of every field, p - t of every
digit, the statuses and the predicted kind). From the `Definition`s, a `Plan` derives

- ``key``: each row's codes (`declare.CODES`) as one index into ``lookup`` [keys, ...]: per key, the values that
  only read codes (`one`, `code_is`), the row's groups (G) and its sketch rows;
- ``match`` [columns of V, matches]: which entries of V must be 0 (+1) or not (-1) for each `same` / `present`
  value (one product: ``((V != 0) @ match) == match_target``);
- ``numbers``: the other values, evaluated over V's columns (`evaluate`);
- where each state's increments are: cells of G^T X (X = the values, G = the groups), then the per-sequence
  means, the batch counts and the given sums, in one flat vector (``index``).

`accumulate` runs it with torch ops (any device); `owa_metrics.functional.kernel.accumulate` runs the same plan in
one compiled loop over the rows on the CPU.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np
import torch

from ..decode.event_batch import VALUE_COLUMNS, EventBatch
from ..schema import CATEGORY_NAMES, KIND_CATEGORY, Category, Kind, Status
from .declare import (
    BATCH_COUNTS, CODES, GROUPS, ONE, SUM_PARTS, BatchCounts, Definition, Given, GivenSamples, Samples, SequenceMean,
    Shape, Sums, Value, exact_parts,
)

N_CAT = len(CATEGORY_NAMES)
KIND_CODES = len(Kind) + 1
# the key's axes: statuses, statuses, predicted category, predicted kind + 1, true category
KEY_SIZES = (len(Status), len(Status), N_CAT + 1, KIND_CODES, N_CAT + 1)
TRUE_CATEGORY = Value("number", ("true_category",))
PACKED = Value("packed")  # the sampled rows' count of each `Samples` state, packed: sum_s count_s x SAMPLE_SHIFT^s
SAMPLE_SHIFT = 1 << 26


def row_columns(shape: Shape) -> list[str]:
    """The names of V's columns."""
    digits = [f"{f}_digit_{j}" for f, n in (("timestamp", shape.n_timestamp_digits), ("dx", shape.n_delta_digits),
                                             ("dy", shape.n_delta_digits)) for j in range(n)]
    return ([f"{side}_{c}" for side in ("error", "true", "pred") for c in VALUE_COLUMNS]
            + [f"error_{d}" for d in digits] + ["status", "target_status", "pred_kind"])


def key_codes() -> dict[str, np.ndarray]:
    """Every key's codes (`declare.CODES`), in key order: the key is the mixed-radix number of (status, target
    status, predicted category, predicted kind + 1, true category) (`KEY_SIZES`); the predicted column is the
    predicted category, but for an undecoded type mismatch its type token's (`KIND_CATEGORY`)."""
    status, t_status, p_category, kind_code, category = np.indices(KEY_SIZES).reshape(len(KEY_SIZES), -1)
    undecoded_mismatch = (status == int(Status.TYPE_MISMATCH)) & (p_category == int(Category.INVALID))
    column = np.where(undecoded_mismatch, np.array(KIND_CATEGORY)[np.maximum(kind_code - 1, 0)], p_category)
    return dict(zip(CODES, (status, t_status, column, kind_code - 1, category)))


def _code_value(codes: dict, value: Value) -> np.ndarray:
    """A value that reads only codes, at every key."""
    if value.op == "one":
        return np.ones_like(codes["status"], dtype=np.float64)
    code, k = value.args
    return (codes[code] == k).astype(np.float64)


class Plan:
    """The tables of one report (definitions), format (`Shape`), device and kind of update."""

    def __init__(self, definitions: list[Definition], shape: Shape, device, given: tuple[str, ...]):
        self.shape, self.device = shape, torch.device(device)
        self.states: dict[str, object] = {}
        for d in definitions:
            for name, state in d.states(shape).items():
                if name in self.states:
                    raise ValueError(f"state {name!r} of definition {d.name!r} is declared twice")
                self.states[name] = state
        self.column = {name: i for i, name in enumerate(row_columns(shape))}
        self.state_shapes = {n: (len(s.groups), len(s.values)) for n, s in self.states.items() if isinstance(s, Sums)}
        self.state_shapes.update({n: s.shape for n, s in self.states.items() if isinstance(s, Given)})
        sums = {n: s for n, s in self.states.items() if isinstance(s, Sums) and s.when in (None, *given)}
        seqs = {n: s for n, s in self.states.items() if isinstance(s, SequenceMean)}
        self.samples = {n: s for n, s in self.states.items() if isinstance(s, Samples)}
        self.given = [n for n, s in self.states.items() if isinstance(s, Given) and n in given]  # added as given
        self.given_samples = [n for n, s in self.states.items() if isinstance(s, GivenSamples)]
        self._columns(sums, seqs)
        groups = list(dict.fromkeys([g for s in sums.values() for g in s.groups] + [s.group for s in seqs.values()]
                                    + [s.group for s in self.samples.values()] + ["all"]))
        unknown = set(groups) - set(GROUPS)
        if unknown:
            raise ValueError(f"unknown groups {sorted(unknown)}: the groups are {sorted(GROUPS)}")
        g_index = {g: i for i, g in enumerate(groups)}
        self._lookup(groups, [g_index[s.group] for s in seqs.values()],
                     [g_index[s.group] for s in self.samples.values()])
        self._matches()
        self._index(sums, seqs, g_index)

    def _columns(self, sums: dict, seqs: dict) -> None:
        """X's columns: the values of the sums and the sequence means, code values first, then matches, then
        numbers (with one or two `Samples` states, their rows' numbers packed into one code value: one host read,
        exact); the sample values (each state's, then the true category when split by it); the number leaves."""
        self.packed = 0 < len(self.samples) <= 2
        values = list(dict.fromkeys([v for s in sums.values() for v in s.values.values()]
                                    + [s.value for s in seqs.values()] + [ONE] + ([PACKED] if self.packed else [])))
        self.coded = [v for v in values if v.op in ("one", "is", "packed")]
        self.matches = [v for v in values if v.op == "match"]
        self.numbers = [v for v in values if v.op not in ("one", "is", "packed", "match")]
        self.x_columns = self.coded + self.matches + self.numbers
        self.sample_values, self.sample_widths = [], []
        for s in self.samples.values():
            values = [*s.values.values(), *([TRUE_CATEGORY] if s.by_category else [])]
            self.sample_values += values
            self.sample_widths.append(len(values))
        self.leaves = list(dict.fromkeys(_leaves(self.numbers + self.sample_values)))  # read in one index_select
        self.leaf_columns = torch.tensor([self.column[n] for n in self.leaves] or [0], device=self.device)

    def _lookup(self, groups: list[str], seq_groups: list[int], sample_groups: list[int]) -> None:
        """The table by key (`key_codes`): code values, groups (G), then again the groups of the sequence means and
        of the samples; the key's weights over V's code columns."""
        codes = key_codes()
        group_table = np.stack([GROUPS[g](codes) for g in groups], 1).astype(np.float64)
        packed = (group_table[:, sample_groups] * (float(SAMPLE_SHIFT) ** np.arange(len(sample_groups)))).sum(1)
        code_table = np.stack([packed if v == PACKED else _code_value(codes, v) for v in self.coded], 1)
        self.n_coded, self.n_groups = len(self.coded), len(groups)
        self.split_sizes = [len(self.coded), len(groups), len(seq_groups), len(sample_groups)]
        self.lookup = torch.from_numpy(np.concatenate([code_table, group_table, group_table[:, seq_groups],
                                                       group_table[:, sample_groups]], 1)).to(self.device)
        self.seq_groups = torch.tensor(seq_groups, device=self.device, dtype=torch.long)
        self.sample_groups = torch.tensor(sample_groups or [0], device=self.device)
        self.key_weights = torch.tensor(np.cumprod((1,) + KEY_SIZES[:0:-1])[::-1].copy(), device=self.device)
        self.key_offsets = torch.tensor([0, 0, 0, KEY_SIZES[-1], 0], device=self.device)  # kind -1 -> kind code 0
        self.key_columns = torch.tensor([self.column[c] for c in ("status", "target_status", "pred_category",
                                                                  "pred_kind", "true_category")], device=self.device)

    def _matches(self) -> None:
        """``match`` [V's columns, matches]: +1 where the entry must be 0, -1 where it must not; all hold where
        ``(V != 0) @ match`` equals ``match_target`` (the -1s' sum)."""
        match = np.zeros((len(self.column), max(len(self.matches), 1)), dtype=np.float32)
        for j, v in enumerate(self.matches):
            zero, nonzero = v.args
            match[[self.column[n] for n in zero], j] = 1
            match[[self.column[n] for n in nonzero], j] = -1
        self.match = torch.from_numpy(match).to(self.device)
        self.match_cut = len(self.matches) < match.shape[1]  # no match: one empty column
        self.match_target = torch.from_numpy(np.minimum(match, 0).sum(0)).to(self.device)

    def _index(self, sums: dict, seqs: dict, g_index: dict[str, int]) -> None:
        """Where each state's increments are in the flat sources of `accumulate`: G^T X [groups, X], the sequences
        with any and the sums of means of the sequence means, the batch counts; then the sampled rows' numbers
        (the packed value's sum over all rows, or each group's count of events)."""
        width = len(self.x_columns)
        x_index = {v: i for i, v in enumerate(self.x_columns)}
        self.seq_values = torch.tensor([x_index[s.value] for s in seqs.values()], device=self.device,
                                       dtype=torch.long)
        index = {name: [g_index[g] * width + x_index[v] for g in s.groups for v in s.values.values()]
                 for name, s in sums.items()}
        offset = self.n_groups * width
        for k, name in enumerate(seqs):  # (sum of means as `exact_parts`, sequences)
            index[name] = [offset + len(seqs) + SUM_PARTS * k + j for j in range(SUM_PARTS)] + [offset + k]
            self.state_shapes[name] = (SUM_PARTS + 1,)
        offset += (SUM_PARTS + 1) * len(seqs)
        for name, s in self.states.items():
            if isinstance(s, BatchCounts):
                index[name] = list(range(offset, offset + len(BATCH_COUNTS)))
                self.state_shapes[name] = (len(BATCH_COUNTS),)
        self.sample_counts = ([g_index["all"] * width + x_index[PACKED]] if self.packed else
                              [g_index[s.group] * width + x_index[ONE] for s in self.samples.values()])
        self.sums_states = list(index)
        self.sizes = [len(index[name]) for name in self.sums_states] + [len(self.sample_counts)]
        self.index = torch.tensor([i for name in self.sums_states for i in index[name]] + self.sample_counts,
                                  device=self.device)

    @classmethod
    @functools.lru_cache(maxsize=None)
    def get(cls, definitions: tuple[Definition, ...], shape: Shape, device, given: tuple[str, ...]) -> "Plan":
        return cls(list(definitions), shape, device, given)

    # ---------------------------------------------------------------------------------------- sketch rows
    def sketch_layout(self, size: int) -> dict[str, tuple[int, ...]]:
        """Each `Samples` state's sketch shape: [values, groups (1, or 1 + categories), size]."""
        return {n: (len(s.values), 1 + N_CAT if s.by_category else 1, size) for n, s in self.samples.items()}

    @functools.cached_property
    def sketch_tables(self) -> tuple[list[int], torch.Tensor, int]:
        """``(columns, rows, n_rows)``: each sketched column's sample value (index into the sample values of
        `sample_values`) and, per key, its sketch row (``n_rows``: dropped, the key is not in the state's group)."""
        codes, g_table = key_codes(), self.lookup[:, self.n_coded:].cpu().numpy()
        category = np.minimum(codes["target_category"], N_CAT - 1)
        columns, rows, members, base, value_base = [], [], [], 0, 0
        for k, s in enumerate(self.samples.values()):
            in_group = g_table[:, int(self.sample_groups[k])] > 0
            n_g = 1 + N_CAT if s.by_category else 1
            for j in range(len(s.values)):  # each value in the group's row, then (split) in its category's
                for row in [base + j * n_g] + ([base + j * n_g + 1 + category] if s.by_category else []):
                    columns.append(value_base + j)
                    rows.append(np.broadcast_to(row, category.shape))
                    members.append(in_group)
            base += len(s.values) * n_g
            value_base += len(s.values) + s.by_category
        n_rows = base
        table = np.where(np.stack(members, 1), np.stack(rows, 1), n_rows)
        return columns, torch.from_numpy(table).to(self.device), n_rows


def _leaves(values: list[Value]) -> list[str]:
    out = []
    for v in values:
        if v.op == "number":
            out.append(v.args[0])
        elif v.op not in ("one", "is", "match"):
            out += _leaves([a for a in v.args if isinstance(a, Value)])
    return out


# ------------------------------------------------------------------------------------------ the torch path
def row_matrix(batch: EventBatch) -> torch.Tensor:
    """V [N, columns] (`row_columns`) of a decoded batch."""
    t, p = batch.target, batch.pred
    statuses = torch.stack([batch.status, t.status, p.kind], 1)
    return torch.cat([p.values - t.values, t.values, p.values, p.digits - t.digits, statuses], 1)


def evaluate(values: list[Value], leaf_matrix: torch.Tensor, names: list[str], window_ns: int) -> list[torch.Tensor]:
    """Each number value over the rows, from its leaves (``leaf_matrix``: the float64 columns ``names`` of V): one op
    per node, shared nodes once; the squares of leaves in one product, the ranges of one leaf (`within`) in one
    comparison, and the percentages that nothing else reads in one ``where`` at the end."""
    leaves = dict(zip(names, leaf_matrix.unbind(1)))
    memo: dict[Value, torch.Tensor] = {}
    half = window_ns // 2
    squares = [v for v in dict.fromkeys(a for v in values for a in _nodes(v))
               if v.op == "mul" and v.args[0] == v.args[1] and v.args[0].op == "number"]
    if len(squares) > 1:  # the squares of leaves: of every leaf in one product
        squared = dict(zip(leaves, (leaf_matrix * leaf_matrix).unbind(1)))
        memo.update((v, squared[v.args[0].args[0]]) for v in squares)
    ranges: dict[str, list[Value]] = {}
    for v in dict.fromkeys(a for v in values for a in _nodes(v)):
        if v.op == "within" and v.args[0].op == "number":
            ranges.setdefault(v.args[0].args[0], []).append(v)
    for leaf, nodes in ranges.items():  # every range of one leaf in one comparison
        if len(nodes) > 1:
            low, high = _bounds(tuple(v.args[1:] for v in nodes), leaf_matrix.device)
            x = leaves[leaf][:, None]
            memo.update(zip(nodes, ((x >= low) & (x <= high)).double().unbind(1)))
    operands = {a for v in values for a in _nodes(v) if a is not v}
    last = [v for v in dict.fromkeys(values) if v.op in ("pct", "rootpct") and v not in operands]

    def run(v: Value) -> torch.Tensor:
        if v in memo:
            return memo[v]
        a = [run(x) if isinstance(x, Value) else x for x in v.args] if v.op not in ("number", "match", "one") else []
        if v.op == "number":
            out = leaves[v.args[0]]
        elif v.op == "one":
            out = torch.ones_like(leaf_matrix[:, 0])
        elif v.op == "match":  # (entries that must be 0, entries that must not)
            zero, nonzero = v.args
            out = torch.stack([leaves[n] == 0 for n in zero] + [leaves[n] != 0 for n in nonzero], 1).all(1).double()
        elif v.op == "add":
            out = a[0] + a[1]
        elif v.op == "sub":
            out = a[0] - a[1]
        elif v.op == "mul":
            out = a[0] * a[1]
        elif v.op == "abs":
            out = a[0].abs()
        elif v.op == "rootpct":
            out = (torch.where(a[1] != 0, a[0] / a[1] * 100, float("nan")) * 100).sqrt()
        elif v.op == "ms":
            out = a[0] / 1e6
        elif v.op == "within":
            out = ((a[0] >= a[1]) & (a[0] <= a[2])).double()
        elif v.op == "wrap":  # exact in float64: integers, and fmod is exact
            out = torch.remainder(a[0] + half, window_ns) - half
        elif v.op == "pct":
            out = torch.where(a[1] != 0, a[0] / a[1] * 100, float("nan"))
        elif v.op == "direction":
            px, py, gx, gy = a
            angles = torch.atan2(torch.stack([py, gy], 1), torch.stack([px, gx], 1))  # one atan2: equal angles exactly
            delta = (angles[:, 0] - angles[:, 1]).abs()
            gx2, gy2 = (Value("mul", (g, g)) for g in v.args[2:])  # g != 0: |g|² != 0 (the norm's, when computed)
            out = torch.where(run(Value("add", (gx2, gy2))) != 0,
                              torch.minimum(delta, 2 * math.pi - delta) * (180 / math.pi), float("nan"))
        else:
            raise ValueError(f"unknown value op {v.op!r}")
        memo[v] = out
        return out

    if len(last) > 1:
        num, den = (torch.stack([run(v.args[k]) for v in last], 1) for k in (0, 1))
        ratios = torch.where(den != 0, num / den * 100, float("nan")).unbind(1)
        memo.update((v, (x * 100).sqrt() if v.op == "rootpct" else x) for v, x in zip(last, ratios))
    return [run(v) for v in values]


@functools.lru_cache(maxsize=None)
def _bounds(ranges: tuple[tuple[int, int], ...], device) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high ends of ``ranges`` as float64 tensors on ``device`` (made once)."""
    return tuple(torch.tensor(ends, dtype=torch.float64, device=device) for ends in zip(*ranges))


def _nodes(v: Value):
    yield v
    if v.op not in ("number", "match"):
        for a in v.args:
            if isinstance(a, Value):
                yield from _nodes(a)


def accumulate(plan: Plan, batch: EventBatch, sketched: Optional[list[int]] = None,
               group: Optional[torch.Tensor] = None, groups: int = 1) -> tuple[
        list, Optional[torch.Tensor], torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """One batch with torch ops: ``(increments, samples, sampled, key, row_group)``: the increments [groups, size] of
    ``plan.sums_states`` then the sampled rows' numbers (`Plan.sample_counts`), split from one flat [groups, ...]
    matrix; every row's sample values [N, `Plan.sample_values`] (or, for a sketch, the values ``sketched`` picks),
    whether each row is in each `Samples` state's group [N, states], the keys, and each row's group.

    ``group`` [num_sequences]: each sequence's group (a tag) in [0, groups), None: one group. Every state family is
    accumulated once for all groups: G^T X by group (one product with the groups x tags indicator), the sequence means
    and the batch counts scattered by the sequences' groups."""
    V = row_matrix(batch)
    key = torch.addcmul(plan.key_offsets, V.index_select(1, plan.key_columns), plan.key_weights).sum(1)
    coded, member, seq_groups, sampled = plan.lookup.index_select(0, key).split(plan.split_sizes, 1)
    leaf_matrix = V.index_select(1, plan.leaf_columns).double()
    evaluated = evaluate(plan.numbers + plan.sample_values, leaf_matrix, plan.leaves, plan.shape.window_ns)
    parts = [coded]
    if plan.matches:
        matched = ((V != 0).float() @ plan.match) == plan.match_target
        parts.append(matched[:, :len(plan.matches)] if plan.match_cut else matched)
    parts += [torch.stack(evaluated[:len(plan.numbers)], 1)] if plan.numbers else []
    x = torch.cat(parts, 1)  # float64: the code values are
    row_group = None if group is None else group.index_select(0, batch.seq_idx)
    if row_group is None:
        sources = [(member.T @ x).view(1, -1)]
    else:  # [N, groups x event groups]: each row's event groups in its own group's block
        by_group = (row_group[:, None] == torch.arange(groups, device=key.device))[:, :, None] * member[:, None]
        sources = [(by_group.view(len(key), groups * member.shape[1]).T @ x).view(groups, -1)]
    if plan.split_sizes[2]:  # per sequence: events of the group and the value's sum, over the events (one division):
        # the sequences with any, and the sum of the means as `exact_parts` (0 for a sequence without events)
        S = plan.split_sizes[2]
        terms = torch.cat([seq_groups, seq_groups * x.index_select(1, plan.seq_values)], 1)
        per_seq = torch.zeros((batch.num_sequences, 2 * S), dtype=torch.float64, device=key.device).index_add_(
            0, batch.seq_idx, terms)
        means = per_seq / per_seq[:, :S].clamp(min=1).repeat(1, 2)
        means = torch.cat([means[:, :S], exact_parts(means[:, S:]).flatten(1)], 1)
        sources.append(means.sum(0, keepdim=True) if group is None else
                       means.new_zeros((groups, means.shape[1])).index_add_(0, group, means))
    gap = batch.pred_count - batch.target_count
    # sequences, count matches, predicted events, extra and missing events (the clamp only cuts gap and -gap)
    per_seq = torch.stack([gap == gap, gap == 0, batch.pred_count, gap, -gap], 1).clamp(min=0)
    if group is None:
        per_batch = per_seq.sum(0, keepdim=True)
        if batch.time_matching is not None:  # the generated events paired with nothing, the target events unpaired
            missing = (batch.status == int(Status.MISSING)).sum().reshape(1, 1)
            per_batch = torch.cat([per_batch[:, :3], batch.time_matching.extra_events.reshape(1, 1), missing], 1)
    else:
        if batch.time_matching is not None:
            per_seq = torch.cat([per_seq[:, :3], _unpaired(batch)], 1)
        per_batch = torch.zeros((groups, 5), dtype=torch.float64, device=key.device).index_add_(
            0, group, per_seq.double())
    sources.append(per_batch)
    increments = torch.cat(sources, 1).index_select(1, plan.index).split(plan.sizes, 1)
    values = evaluated[len(plan.numbers):]
    if sketched is not None:  # in the order of the sketch's columns (`Plan.sketch_tables`)
        values = [values[j] for j in sketched]
    samples = torch.stack(values, 1) if values else None
    return list(increments), samples, sampled, key, row_group


def _unpaired(batch: EventBatch) -> torch.Tensor:
    """[num_sequences, 2] (time pairing): per sequence, the valid generated events paired with nothing and the
    target events unpaired (status MISSING): `TimeMatching`'s ``extra_events`` and the missing count, by sequence."""
    generated, B = batch.generated, batch.num_sequences
    n = len(generated.status)
    paired = batch.time_matching.paired
    in_pair = torch.zeros(n + 1, dtype=torch.bool, device=paired.device).index_fill_(
        0, torch.where(paired >= 0, paired, n), True)[:n]
    out = torch.zeros((B, 2), dtype=torch.long, device=paired.device)
    out[:, 0].index_add_(0, batch.generated_seq.long(), ((generated.status == int(Status.VALID)) & ~in_pair).long())
    out[:, 1].index_add_(0, batch.seq_idx, (batch.status == int(Status.MISSING)).long())
    return out


# ------------------------------------------------------------------------------------------ the compiled path's tables
OPS = ("number", "add", "sub", "mul", "abs", "rootpct", "ms", "wrap", "pct", "direction", "within")


def program(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The number values as instructions over registers, for the compiled loop: ``(code [n, 6]: op, destination,
    up to four operands (a V column for ``number``, constants as they are), registers of the sum values, of the
    sample values, depends [n, n]: the registers each one is computed from, itself included)``; each shared node
    once, in order."""
    register: dict[Value, int] = {}
    code, reads = [], []

    def emit(v: Value) -> int:
        if v not in register:
            operands = [plan.column[v.args[0]]] if v.op == "number" else [
                emit(a) if isinstance(a, Value) else a for a in v.args]
            register[v] = len(register)
            code.append([OPS.index(v.op), register[v], *operands, *[0] * (4 - len(operands))])
            reads.append([o for a, o in zip(v.args, operands) if isinstance(a, Value)] if v.op != "number" else [])
        return register[v]

    sums = [emit(v) for v in plan.numbers]
    samples = [emit(v) for v in plan.sample_values]
    depends = np.eye(max(len(code), 1), dtype=bool)
    for r, operands in enumerate(reads):  # operands come first: their rows are complete
        for a in operands:
            depends[r] |= depends[a]
    return (np.array(code or [[0] * 6], dtype=np.int64), np.array(sums, dtype=np.int64),
            np.array(samples, dtype=np.int64), depends)


@functools.lru_cache(maxsize=None)  # one per plan (plans are kept: `Plan.get`)
def compiled_tables(plan: Plan) -> dict[str, np.ndarray]:
    """What `owa_metrics.functional.kernel.accumulate` reads besides the rows: the key, the code values and groups by
    key, the matches as lists of (column, sign), the program, per key the cells of G^T X it adds to, the sequence
    means and the samples' groups."""
    lookup = plan.lookup.cpu().numpy()
    width = len(plan.x_columns)
    needed = sorted({int(i) for i in plan.index.tolist() if i < plan.n_groups * width})
    cell_group, cell_x = np.divmod(np.array(needed, dtype=np.int64), width)
    active = lookup[:, plan.n_coded + cell_group] != 0  # [keys, cells]
    cells = np.array(needed, dtype=np.int64)
    coded = cell_x < plan.n_coded
    const_values = np.where(coded, lookup[:, np.minimum(cell_x, plan.n_coded - 1)], 0) * active
    constant, variable = const_values != 0, active & ~coded
    # per key, what its cells and sequence means read: which matches, which instructions (with the samples')
    seq_active = lookup[:, plan.n_coded + plan.seq_groups.cpu().numpy()] != 0  # [keys, means]
    read = np.zeros((len(lookup), width), dtype=bool)
    np.logical_or.at(read, (np.nonzero(active)[0], cell_x[np.nonzero(active)[1]]), True)
    for s, x in enumerate(plan.seq_values.tolist()):
        read[:, x] |= seq_active[:, s]
    reads_match = read[:, plan.n_coded:plan.n_coded + len(plan.matches)]
    match = plan.match.cpu().numpy()[:, :len(plan.matches)]
    columns, entries = np.nonzero(match.T)
    code, sum_regs, sample_regs, depends = program(plan)
    needs = read[:, plan.n_coded + len(plan.matches):].astype(np.int64) @ depends[sum_regs].astype(np.int64) > 0
    widths = plan.sample_widths
    for k, start in enumerate(np.cumsum([0, *widths[:-1]]).tolist()):
        in_group = lookup[:, plan.n_coded + int(plan.sample_groups[k])] != 0
        needs |= in_group[:, None] & depends[sample_regs[start:start + widths[k]]].any(0)[None]
    return {
        "key_columns": plan.key_columns.cpu().numpy(), "key_weights": plan.key_weights.cpu().numpy(),
        "key_offsets": plan.key_offsets.cpu().numpy(), "coded": np.ascontiguousarray(lookup[:, :plan.n_coded]),
        "groups": np.ascontiguousarray(lookup[:, plan.n_coded:]),
        "match_ptr": np.concatenate([[0], np.cumsum(np.bincount(columns, minlength=len(plan.matches)))]),
        "match_column": entries.astype(np.int64), "match_sign": match.T[columns, entries].astype(np.int64),
        "code": code, "sum_regs": sum_regs, "sample_regs": sample_regs, "n_regs": np.int64(len(depends)),
        "read_ptr": np.concatenate([[0], np.cumsum(reads_match.sum(1))]).astype(np.int64),
        "read_match": np.nonzero(reads_match)[1].astype(np.int64),
        "run_ptr": np.concatenate([[0], np.cumsum(needs.sum(1))]).astype(np.int64),
        "run": np.nonzero(needs)[1].astype(np.int64),
        # per key: the cells of code values with their (constant) non-zero value, then the cells of the rest
        "const_ptr": np.concatenate([[0], np.cumsum(constant.sum(1))]).astype(np.int64),
        "const_cell": cells[np.nonzero(constant)[1]], "const_value": const_values[np.nonzero(constant)],
        "cell_ptr": np.concatenate([[0], np.cumsum(variable.sum(1))]).astype(np.int64),
        "cell_flat": cells[np.nonzero(variable)[1]], "cell_x": cell_x[np.nonzero(variable)[1]],
        "seq_groups": plan.seq_groups.cpu().numpy(), "seq_values": plan.seq_values.cpu().numpy(),
        "sample_groups": plan.sample_groups.cpu().numpy()[:len(plan.samples)],
        "sample_offsets": np.concatenate([[0], np.cumsum(plan.sample_widths)]).astype(np.int64),
        "index": plan.index.cpu().numpy(),
    }
