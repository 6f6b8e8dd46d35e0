"""How an update adds to `OWAEventMetrics`' states, on its two paths: `accumulate_batch` from a decoded `EventBatch`
with torch ops (any device), `accumulate_arrays` from the compiled decoder's arrays with compiled loops (CPU). Both
follow the same plan (`owa_metrics.functional.plan.Plan`: every declared state), each row into its sequence's tag."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..decode.batch import batch_of_arrays
from ..decode.event_batch import EventBatch
from ..functional import kernel as compiled
from ..functional.plan import SAMPLE_SHIFT, Plan, accumulate
from ..functional.stats import sketch_counts
from ..functional.tokens import given_token_losses, token_losses
from .base import append_samples


def accumulate_batch(metric, batch: EventBatch, tokens, group: Optional[torch.Tensor] = None) -> None:
    """Every state from a decoded batch with torch ops (`owa_metrics.functional.plan.accumulate`), added in one
    ``_foreach_add_`` (with the sketch counts in sketch mode, and the given sums); exact mode reads the numbers of
    sampled rows in one host sync, then selects them. ``group``: each sequence's tag: every state family by tag in
    the same ops."""
    names = metric._given_names(tokens is not None, tokens is not None and tokens.loss_sum is not None)
    plan = Plan.get(metric.definitions, metric.shape, batch.seq_idx.device, names)
    sketch = metric.mode == "sketch" and plan.samples
    G = metric._groups
    increments, samples, sampled, key, row_group = accumulate(plan, batch, plan.sketch_tables[0] if sketch else None,
                                                              group, G)
    states = _flat_states(metric, [metric.kept(name) for name in plan.sums_states])
    increments, counts = increments[:-1], increments[-1]
    if sketch:
        _, rows, n_rows = plan.sketch_tables
        cell = rows.index_select(0, key)
        if row_group is None:
            flat = sketch_counts(samples, metric.spec, cell, n_rows + 1)
            states += _flat_states(metric, [metric.kept(name) for name in plan.samples])
            increments += flat.view(1, -1).split([getattr(metric, metric.kept(name)).numel() for name in plan.samples]
                                                 + [metric.spec.size], 1)[:-1]  # the last: no state's group
        else:
            _sketch_by_tag(metric, plan, samples, cell, n_rows, row_group)
    extras = {"tokens": tokens, "group": group, "groups": G}
    given = [piece for name in plan.given for piece in plan.states[name].fn(batch, extras)]
    views = _given_views(metric, plan)
    _check_by_tag(metric, plan, given, views)
    torch._foreach_add_(states + views, increments + given)
    rows = metric.mode == "exact" and plan.samples
    values, tags, kept, sizes = _given_samples(
        metric, plan, batch, extras, (counts if row_group is None else counts.sum(0)) if rows else None, len(samples))
    if rows:
        _append_rows(metric, plan, samples, sampled, sizes[:len(plan.samples)], row_group)
    _add_given_samples(metric, plan, values, tags, kept, sizes[len(plan.samples) if rows else 0:])


def accumulate_arrays(metric, out: dict, preds: torch.Tensor, target: torch.Tensor, logits: Optional[torch.Tensor],
                      token_loss: Optional[torch.Tensor] = None, group: Optional[torch.Tensor] = None) -> None:
    """The same states as `accumulate_batch`, from compiled loops over the decoded arrays ``out`` of
    `kernel_arrays`: `functional.kernel.accumulate` over the rows with the same plan (and `token_stats` of the ids
    under teacher forcing), each row into its sequence's tag (``group``) in the same loop."""
    whole, with_loss, G = {}, logits is not None or token_loss is not None, metric._groups
    seq_group = np.zeros(target.shape[0], dtype=np.int64) if group is None else group.numpy()
    if metric.alignment == "teacher_forcing":
        t = out["target"]
        by_row = group is not None
        losses, skipped = (token_losses(logits, target, by_row=by_row) if logits is not None else
                           given_token_losses(token_loss, target, by_row=by_row) if token_loss is not None else
                           (torch.zeros(1), 0))
        fields, loss = np.zeros(metric.token_fields.shape), np.zeros(metric.token_loss.shape)
        compiled.token_stats(out["seq"], t["status"], t["kind"], t["values"], t["start"], t["end"], t["start_cut"],
                             target.shape[1], target.numpy().reshape(-1), preds.numpy().reshape(-1),
                             metric._field_table, losses.numpy(), with_loss, seq_group,
                             fields.reshape(G, *fields.shape[-2:]), loss.reshape(G, -1))
        # the loop adds the valid targets' loss by category: the last column is free
        loss[..., -1] = np.bincount(seq_group, skipped.numpy(), G) if by_row and with_loss else skipped
        whole = {"token_fields": torch.from_numpy(fields), "token_loss": torch.from_numpy(loss)}
    plan = Plan.get(metric.definitions, metric.shape, "cpu",
                    metric._given_names(metric.alignment == "teacher_forcing", with_loss))
    # the other given states read the decoded batch: its arrays as an `EventBatch` (no copy)
    batch = batch_of_arrays(out, metric.shape.n_timestamp_digits, target.shape[0], metric.alignment) \
        if set(plan.given) - set(whole) or plan.given_samples else None
    extras = {"tokens": None, "group": group, "groups": G, "host_reads": True}
    axis = (slice(None),) if metric.tags else ()
    pieces = [piece for name in plan.given for piece in (  # as declared
        [whole[name][axis + tuple(part)] for part in plan.states[name].parts] if name in whole else
        plan.states[name].fn(batch, extras))]
    increments, samples, row_groups = compiled.accumulate(plan, out, metric.mode == "sketch", metric.spec,
                                                          None if group is None else seq_group, G)
    states = list(plan.sums_states) + (list(plan.samples) if metric.mode == "sketch" and group is None else [])
    views = _given_views(metric, plan)
    _check_by_tag(metric, plan, pieces, views)
    torch._foreach_add_(_flat_states(metric, [metric.kept(n) for n in states]) + views, increments + pieces)
    if metric.mode == "sketch" and group is not None:  # counted in place, by tag
        compiled.sketch_by_group(plan, samples, row_groups, metric.spec,
                                 [getattr(metric, metric.kept(n)) for n in plan.samples])
    if metric.mode == "exact":
        for name, values, tag in zip(plan.samples, samples, row_groups):
            if group is not None:  # each row's tag last
                values = torch.cat([values, tag[:, None].to(values.dtype)], 1)
            append_samples(getattr(metric, metric.kept(name)), values.reshape(-1))
    _add_given_samples(metric, plan, *_given_samples(metric, plan, batch, extras))


def _sketch_by_tag(metric, plan: Plan, samples: torch.Tensor, cell: torch.Tensor, n_rows: int,
                   row_group: torch.Tensor) -> None:
    """With tags, the sketched values counted in place (no dense increment of tags x the sketches): per `Samples`
    state one ``index_add_`` of its columns (``cell``: each one's sketch row, ``n_rows``: none) into the rows of
    the row's tag."""
    size, counted = metric.spec.size, (~torch.isnan(samples) & (cell < n_rows)).double()
    bucket = metric.spec.index(torch.nan_to_num(samples))
    column, base = 0, 0
    for name, state in plan.samples.items():
        target = getattr(metric, metric.kept(name))
        per_tag, width = target[0].numel() // size, len(state.values) * (2 if state.by_category else 1)
        local = (cell[:, column:column + width] - base).clamp(0, per_tag - 1) + row_group[:, None] * per_tag
        target.view(-1).index_add_(0, (local * size + bucket[:, column:column + width]).reshape(-1),
                                   counted[:, column:column + width].reshape(-1))
        column, base = column + width, base + per_tag


def _append_rows(metric, plan: Plan, samples: torch.Tensor, sampled: torch.Tensor, sizes: list[int],
                 row_group: Optional[torch.Tensor] = None) -> None:
    """Each `Samples` state's rows: the rows of its group (``sizes``: their numbers, `_given_samples`), its values
    (then, with tags, the row's tag)."""
    rows = torch.nonzero_static(sampled.T, size=sum(sizes))[:, 1].split(sizes)
    for name, chosen, values in zip(plan.samples, rows, samples.split(plan.sample_widths, 1)):
        if row_group is not None:
            values = torch.cat([values, row_group[:, None].to(values.dtype)], 1)
        append_samples(getattr(metric, metric.kept(name)), values.index_select(0, chosen).reshape(-1))


def _given_samples(metric, plan: Plan, batch: EventBatch, extras: dict, counts: Optional[torch.Tensor] = None,
                   n_rows: int = 0) -> tuple[list, list, list[torch.Tensor], list[int]]:
    """``(values, tags, kept, sizes)``: the `GivenSamples` states' values (NaN: no sample), with tags each value's
    tag (else None), and, in exact mode, which are kept (not NaN) and, in one host sync, the numbers of sampled
    rows of each `Samples` state (``counts``, packed: see `Plan.sample_counts`; ``n_rows`` rows) when given, then
    of each given state's kept values."""
    given = [plan.states[name].fn(batch, extras) for name in plan.given_samples]
    given = [(g, None) if isinstance(g, torch.Tensor) else g for g in given]  # values alone: no tags
    if metric.tags and any(seq is None for _, seq in given):
        raise ValueError(f"the GivenSamples states {[n for n, (_, q) in zip(plan.given_samples, given) if q is None]}"
                         " give their values without their sequences: with tags, return (values, seq) from the "
                         "state's fn (seq: the sequence of each value, in the batch)")
    values = [x.to(metric.device, torch.float64) for x, _ in given]
    group = extras.get("group")
    tags = [None if group is None else group.index_select(0, seq.long()) for _, seq in given]
    if metric.mode == "sketch" or (counts is None and not values):
        return values, tags, [], []
    if counts is not None and plan.packed and n_rows >= SAMPLE_SHIFT:  # the packed count would not be exact
        raise ValueError(f"{n_rows} target events in one update: exact mode reads at most {SAMPLE_SHIFT - 1} per "
                         "update; split the batch")
    kept = [~torch.isnan(x) for x in values]
    parts = ([] if counts is None else [counts]) + [k.sum(0, keepdim=True, dtype=torch.float64) for k in kept]
    read = np.ravel(parts[0].tolist() if len(parts) == 1 else
                    torch.cat([p if p.dim() == 1 else p.view(-1) for p in parts]).tolist()).tolist()
    sizes = [int(n) for n in read[len(read) - len(values):]]
    if counts is None:
        return values, tags, kept, sizes
    rows = [int(n) for n in read[:len(read) - len(values)]]
    if plan.packed:
        rows = [rows[0] // SAMPLE_SHIFT ** k % SAMPLE_SHIFT for k in range(len(plan.samples))]
    return values, tags, kept, rows + sizes


def _add_given_samples(metric, plan: Plan, values: list[torch.Tensor], tags: list, kept: list[torch.Tensor],
                       sizes: list[int]) -> None:
    """The `GivenSamples` states' ``values`` (`_given_samples`): counted in the sketch, or their ``kept`` ones
    (``sizes`` of them) kept; with tags, by the tag of each one's sequence (rows (value, tag))."""
    for k, (name, x, tag) in enumerate(zip(plan.given_samples, values, tags)):
        state = getattr(metric, metric.kept(name))
        if metric.mode == "sketch":
            state.add_(sketch_counts(x, metric.spec, tag, metric._groups))
            continue
        at = torch.nonzero_static(kept[k], size=sizes[k])[:, 0]
        rows = x.index_select(0, at)
        if tag is not None:
            rows = torch.stack([rows, tag.index_select(0, at).to(x.dtype)], 1).view(-1)
        append_samples(state, rows)


def _check_by_tag(metric, plan: Plan, pieces: list, views: list) -> None:
    """With tags, raise unless every `Given` piece has the tag axis (a piece without it would be added to every
    tag: a silent wrong number)."""
    if metric.tags and any(p.dim() != v.dim() for p, v in zip(pieces, views)):
        raise ValueError(f"a Given state of {list(plan.given)} gives sums without the tag axis: with tags its fn "
                         "must return them by tag, [extras['groups'], ...] (see declare.per_group)")


def _flat_states(metric, names: list[str]) -> list[torch.Tensor]:
    """Views [groups, -1] of the named states: the additions of both paths go through them without a view op."""
    G = metric._groups
    return [view for name in names for view in _views(metric, name, "flat", lambda state: [state.view(G, -1)])]


def _given_views(metric, plan: Plan) -> list[torch.Tensor]:
    """The views ``state[part]`` that the `Given` states' pieces add to (with tags ``state[:, part]``)."""
    axis = (slice(None),) if metric.tags else ()
    return [view for name in plan.given for view in _views(
        metric, metric.kept(name), "parts", lambda state: [state[axis + tuple(p)] for p in plan.states[name].parts])]


def _views(metric, name: str, kind: str, make) -> list[torch.Tensor]:
    """``make(state)``'s views of a state, kept while the state is the same tensor (`reset` and syncs replace
    it): no view op per state and update."""
    cache = metric.__dict__.setdefault("_views_cache", {})
    state = getattr(metric, name)
    if (name, kind) not in cache or cache[name, kind][0] is not state:
        cache[name, kind] = (state, make(state))
    return cache[name, kind][1]
