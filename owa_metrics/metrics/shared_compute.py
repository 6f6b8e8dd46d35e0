"""`OWAEventMetrics.compute`'s work, shared over the ranks: `Read` (what a `Definition`'s compute reads: the synced
states by name), `definition_keys` (each scope's keys; the ranks deal the (scope, definition) pairs by the samples
they read, `deal`, and exchange the keys) and the warning when too many targets do not decode."""

from __future__ import annotations

from typing import Optional

import torch
from torchmetrics.utilities import rank_zero_warn

from ..functional.declare import Sums
from ..functional.plan import Plan
from ..functional.stats import distinct, distinct_by_group
from ..schema import CATEGORY_NAMES, Status
from .base import Distribution, cat_samples, gather_json


class InvalidTargetsWarning(UserWarning):
    """More than 5 % of the target events do not decode: their share ``rate`` and most frequent failure ``reason``
    (a `Status` label), for callers that say it in their own words (the CLI)."""

    def __init__(self, rate: float, reason: str, message: str):
        self.rate, self.reason = rate, reason
        super().__init__(message)


def deal(work: list, costs: list[float], world: int) -> list[list]:
    """``work`` dealt to ``world`` ranks: each item, costliest first (ties in order), to the rank with the least cost
    so far (the lowest such rank); each rank's items in ``work``'s order."""
    load, owner = [0.0] * world, {}
    for k in sorted(range(len(work)), key=lambda k: -costs[k]):
        rank = load.index(min(load))
        owner[k], load[rank] = rank, load[rank] + costs[k]
    return [[item for k, item in enumerate(work) if owner[k] == rank] for rank in range(world)]


class Named:
    """A state read by the names of its values: ``named.events`` (over the state's groups; one group: a scalar)."""

    def __init__(self, raw: torch.Tensor, names: tuple[str, ...] = ()):
        self.raw, self.names = raw, names

    def __getattr__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise AttributeError(f"no value {name!r}: this state has {self.names}")
        column = self.raw[:, self.names.index(name)]
        return column[0] if len(column) == 1 else column


class Read:
    """What a `Definition`'s compute reads: the (synced) states of an `OWAEventMetrics` by name; all of them, or tag
    ``tag``'s."""

    def __init__(self, metric, tag: Optional[int] = None):
        self.metric, self.tag = metric, tag
        self.plan = Plan.get(metric.definitions, metric.shape, "cpu", metric._given_names(tokens=True))
        self.num_resamples, self.seed, self.alignment = metric.num_resamples, metric.seed, metric.alignment
        self._samples: dict = {}  # (name, value, category) -> its Distribution: each sorted once per compute

    def __getitem__(self, name: str) -> Named:
        state, value = self.plan.states[name], self.given(name)
        return Named(value, tuple(state.values)) if isinstance(state, Sums) else Named(value)

    def given(self, name: str) -> torch.Tensor:
        """A summed state: the pooled one, or tag ``tag``'s (with tags, the states' first axis)."""
        value = getattr(self.metric, self.metric.kept(name))
        if not self.metric.tags:
            return value
        return value.sum(0) if self.tag is None else value[self.tag]

    def _rows(self, name: str, width: int) -> torch.Tensor:
        """An exact-mode samples state's rows [n, width]: all of them, or tag ``tag``'s (with tags each row ends in
        its tag, dropped here)."""
        m = self.metric
        rows = cat_samples(getattr(m, m.kept(name)), m.device)
        if not m.tags:
            return rows.reshape(-1, width)
        rows = rows.reshape(-1, width + 1)
        if self.tag is not None:
            rows = rows[rows[:, -1] == self.tag]
        return rows[:, :-1]

    def samples(self, name: str, value: str, category: Optional[int] = None) -> Distribution:
        """The distribution of a `Samples` state's ``value`` (over its whole group, or the events of one true
        ``category`` when the state is split by it); NaN (not defined) left out. Read once per `Read`."""
        key = name, value, category
        if key not in self._samples:
            self._samples[key] = self._read_samples(name, value, category)
        return self._samples[key]

    def _read_samples(self, name: str, value: str, category: Optional[int]) -> Distribution:
        state, m = self.plan.states[name], self.metric
        j = list(state.values).index(value)
        if m.mode == "sketch":
            counts = self.given(name)
            return Distribution(counts=counts[j, 0 if category is None else 1 + category], spec=m.spec)
        rows = self._rows(name, len(state.values) + state.by_category)
        if not state.by_category:
            return Distribution(*distinct(rows[:, j], drop_nan=True))
        read = distinct_by_group(rows[:, :-1], rows[:, -1], len(CATEGORY_NAMES))  # each value, by category and all
        for v, (by_category, pooled) in zip(state.values, read):
            self._samples.update({(name, v, c): Distribution(*pair) for c, pair in enumerate(by_category)})
            self._samples[name, v, None] = Distribution(*pooled)
        return self._samples[name, value, category]

    def given_samples(self, name: str) -> Distribution:
        m = self.metric
        if m.mode == "sketch":
            return Distribution(counts=self.given(name), spec=m.spec)
        return Distribution.exact(self._rows(name, 1).reshape(-1))


def definition_keys(metric, reads: dict) -> dict:
    """Each read's keys (``reads``: scope -> `Read`; None the pooled states, else a tag's index): every definition's,
    and the invalid-target rate. Where this ``compute()`` synced the states (every rank holds the same ones and is in
    this call: ``OWAEventMetrics._wrap_compute``), the ranks share the work (`deal`): each computes its (scope,
    definition) pairs, and `gather_json` gives every rank every pair's keys (as floats: the same values, whichever
    rank computed them); an error on any rank is raised on every rank."""
    definitions = metric.definitions
    work = [(scope, d) for scope in reads for d in range(len(definitions))]
    group = (metric.process_group or torch.distributed.group.WORLD) if metric._syncs_here and metric._is_synced \
        else None
    world = torch.distributed.get_world_size(group) if group is not None else 1
    if world > 1:  # a pair's cost: its definition's samples, times its scope's share of the sequences
        sequences = {scope: float(read["batch_counts"].raw[0]) for scope, read in reads.items()}
        costs = [sample_count(metric, definitions[d]) * sequences[scope] / max(sequences[None], 1)
                 for scope, d in work]
        work = deal(work, costs, world)[torch.distributed.get_rank(group)]
    done, error = {}, None
    try:
        for scope, d in work:
            done[scope, d] = definitions[d].compute(reads[scope])
    except Exception as err:  # noqa: BLE001 - raised below on every rank, not left to hang the others
        if world == 1:
            raise
        error = err
    if world > 1:
        mine = [[scope, d, {k: float(v) for k, v in keys.items()}] for (scope, d), keys in done.items()]
        every = gather_json([None if error is None else repr(error), mine], group, metric.device)
        if error is not None:
            raise error
        failed = [(rank, said) for rank, (said, _) in enumerate(every) if said is not None]
        if failed:
            raise RuntimeError(f"{type(metric).__name__}.compute() failed on rank {failed[0][0]}: {failed[0][1]}")
        done = {(scope, d): keys for _, part in every for scope, d, keys in part}
    out = {}
    for scope, read in reads.items():
        keys = {}
        for d in range(len(definitions)):
            keys.update(done[scope, d])
        events = read["events"].events.clamp(min=1)
        keys["status/invalid_target_rate"] = read["statuses"].raw[0, int(Status.INVALID_TARGET)] / events
        if metric._screens_are_context:  # no screen event was scored: no screen key (its count and ratio would be 0)
            keys = {k: v for k, v in keys.items() if not k.startswith(("screen/", "detect/screen/"))}
        out[scope] = keys
    return out


def sample_count(metric, definition) -> int:
    """How many sample values ``definition``'s states hold in ``metric`` (its compute's cost, for `deal`)."""
    return sum(sum(p.numel() for p in (v if isinstance(v, list) else [v]))
               for v in (getattr(metric, metric.kept(n)) for n in definition.states(metric.shape)
                         if n in metric._sampled_names))


def warn_invalid_targets(metric, rate: torch.Tensor, threshold: float = 0.05) -> None:
    """Above ``threshold`` of invalid targets / target events, one warning on rank zero naming the most frequent
    decode failure and the likely fix."""
    if float(rate) > threshold:
        failures = Read(metric).given("target_statuses")[0].clone()
        failures[int(Status.VALID)] = 0
        reason = Status(int(failures.argmax())).label
        rank_zero_warn(InvalidTargetsWarning(float(rate), reason, (
            f"{float(rate):.0%} of the target events do not decode (most often: {reason}); they are left out of "
            f"every rate. This metric reads the {metric.vocab.describe()}: if the labels are in the other format, "
            "pass format='hierarchical' | 'factorized'; if screens use other image tokens, pass a CodecConfig with "
            "your image_prefix / image_token / image_suffix (or let the tokenizer's be detected by not passing "
            "config). status/invalid_target_rate logs this rate.")))
