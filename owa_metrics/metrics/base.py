"""What the distribution metrics share: a sample state kept exactly or as a fixed-size sketch."""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
from typing import Any, Callable, Literal, Optional

import torch
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors

from ..functional.stats import (
    SketchSpec, abs_of_counts, bootstrap_iqm_ci_of_counts, distinct, iqm_of_counts, quantile_of_counts,
    sketch_bootstrap_iqm_ci_of_counts, sketch_counts, sketch_distinct,
)

Mode = Literal["exact", "sketch"]


class Distribution:
    """The samples of one quantity, read as ascending distinct values with their counts.

    Exact mode: ``values`` and ``counts`` (float64, the same length), from one sort of the samples
    (`Distribution.exact`); every statistic is O(distinct values) after it. Sketch mode: ``counts`` are the
    bucket counts [spec.size] of ``spec``, read once as their non-empty buckets (`sketch_distinct`).
    """

    def __init__(self, values: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
                 spec: Optional[SketchSpec] = None):
        self.values, self.counts, self.spec = values, counts, spec

    @classmethod
    def exact(cls, samples: torch.Tensor) -> "Distribution":
        """From raw samples: one sort (O(n log n))."""
        return cls(*distinct(samples))

    @property
    def count(self) -> int:
        return int(self.counts.sum().item())

    @functools.cached_property
    def _sample(self) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        return (self.values, self.counts, None) if self.spec is None else sketch_distinct(self.counts, self.spec)

    def distinct(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, counts)``: the distinct values (a sketch: its non-empty buckets' values), ascending."""
        return self._sample[:2]

    def quantile(self, q) -> torch.Tensor:
        return quantile_of_counts(*self._sample[:2], q)

    def iqm(self) -> torch.Tensor:
        return iqm_of_counts(*self._sample)

    def iqm_ci(self, num_resamples: int = 1000, seed: int = 42, confidence: float = 0.95) -> torch.Tensor:
        if self.spec is None:
            return bootstrap_iqm_ci_of_counts(self.values, self.counts, num_resamples, seed, confidence)
        return sketch_bootstrap_iqm_ci_of_counts(*self._sample, num_resamples, seed, confidence)

    def abs(self) -> "Distribution":
        """The distribution of |x| (exact: O(distinct log distinct); a sketch folds its negative buckets onto the
        positive ones)."""
        if self.spec is None:
            return Distribution(*abs_of_counts(self.values, self.counts))
        m = self.spec.buckets_per_sign
        folded = torch.zeros_like(self.counts)
        folded[m:] = self.counts[m:]
        folded[m + 1:] += self.counts[:m].flip(0)
        return Distribution(counts=folded, spec=self.spec)


def cat_samples(state, device) -> torch.Tensor:
    """The flat float64 samples of an exact-mode ``cat`` state (a list before sync, a tensor after); a list's
    pieces are first merged into one in place, so that compute holds the samples once, not twice."""
    if not isinstance(state, list):
        return state.reshape(-1)
    if not state:
        return torch.zeros(0, dtype=torch.float64, device=device)
    state[:] = [dim_zero_cat(state)] if len(state) > 1 else state
    return state[0].reshape(-1)


def append_samples(state: list, samples: torch.Tensor) -> None:
    """Append to an exact-mode ``cat`` state, merging the newest pieces while the one before is at most twice as
    long (in one ``cat``): lengths more than halve along the list, so n samples sit in at most log2(n) + 1 tensors
    (not one per ``update`` call) and each is copied O(log n) times."""
    state.append(samples)
    merged, k = samples.numel(), 1  # the newest k pieces, merged: merged samples
    while k < len(state) and state[-k - 1].numel() <= 2 * merged:
        merged, k = merged + state[-k - 1].numel(), k + 1
    if k > 1:
        state[-k:] = [torch.cat(state[-k:])]


def check_statistics(relative_accuracy: float, sketch_range: tuple[float, float], num_resamples: int,
                     seed: int) -> SketchSpec:
    """The sketch layout of the constructor arguments, each checked (a ValueError naming it)."""
    if not isinstance(relative_accuracy, numbers.Real) or not 0 < relative_accuracy < 1:
        raise ValueError(f"relative_accuracy must be a number in (0, 1), got {relative_accuracy!r}")
    if (not isinstance(sketch_range, (tuple, list)) or len(sketch_range) != 2
            or not all(isinstance(x, numbers.Real) for x in sketch_range) or not 0 < sketch_range[0] < sketch_range[1]):
        raise ValueError(f"sketch_range must be (min, max) with 0 < min < max, got {sketch_range!r}")
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, numbers.Integral) or num_resamples < 1:
        raise ValueError(f"num_resamples (bootstrap resamples per CI) must be a positive int, got {num_resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed (of the bootstrap CIs) must be a non-negative int, got {seed!r}")
    return SketchSpec(float(relative_accuracy), float(sketch_range[0]), float(sketch_range[1]))


def check_same_shape(metric: Metric, **tensors: torch.Tensor) -> None:
    """Raise unless the named tensors have one shape (a metric never broadcasts one input against another)."""
    shapes = {name: tuple(x.shape) for name, x in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{type(metric).__name__}.update needs inputs of one shape, got "
                         + ", ".join(f"{name} {shape}" for name, shape in shapes.items()))


def check_vectors(metric: Metric, preds: torch.Tensor, target: torch.Tensor) -> None:
    """Raise unless ``preds`` and ``target`` are both movement vectors [N, 2]."""
    check_same_shape(metric, preds=preds, target=target)
    if preds.dim() != 2 or preds.shape[1] != 2:
        raise ValueError(f"{type(metric).__name__}.update needs movement vectors [N, 2] (dx, dy), got preds "
                         f"{tuple(preds.shape)} and target {tuple(target.shape)}")


def gather_json(obj, group, device: torch.device) -> list:
    """Every rank's ``obj`` (JSON data: lists, dicts with string keys, strings, None, floats, NaN and infinities
    too, each float read back as itself) in rank order, as UTF-8 bytes in a tensor on ``device`` (the metric's: NCCL
    needs no current device set, unlike ``all_gather_object``, and nothing is unpickled): one ``all_gather`` of the
    sizes, one of the bytes padded to the longest. Call on every rank of ``group``."""
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(device)
    world = torch.distributed.get_world_size(group)
    sizes = torch.empty((world, 1), dtype=torch.int64, device=device)
    torch.distributed.all_gather(list(sizes.unbind(0)), torch.tensor([data.numel()], device=device), group=group)
    sizes = sizes.reshape(-1).tolist()
    out = torch.empty((world, max(sizes)), dtype=torch.uint8, device=device)
    torch.distributed.all_gather(list(out.unbind(0)), torch.cat([data, data.new_zeros(max(sizes) - data.numel())]),
                                 group=group)
    return [json.loads(row[:size].cpu().numpy().tobytes()) for row, size in zip(out, sizes)]


SYNC_HEAD = 16  # the numbers of samples that travel with the fingerprint in `Float64Metric._sync_dist`'s first gather


def mismatch(name: str, layouts: list[dict]) -> str:
    """What differs between the ranks' `Float64Metric._layout` s: each setting whose value is not rank 0's, with
    the first rank that holds another (else the states that differ), and what to do."""
    first, said = layouts[0], []
    for key in dict.fromkeys(key for layout in layouts for key in layout["settings"]):  # (in the settings' order)
        other = next((r for r, layout in enumerate(layouts) if layout["settings"].get(key) != first["settings"].get(key)),
                     None)
        if other is not None:
            said.append(f"{key} {first['settings'].get(key)!r} on rank 0 but {layouts[other]['settings'].get(key)!r} "
                        f"on rank {other}")
    said = said[:3] + [f"and {len(said) - 3} more"] * (len(said) > 3)
    shapes = any(layout["states"] != first["states"] for layout in layouts)
    if not said:  # another class, or states of other names or shapes (e.g. a subclass's own argument)
        other = next(r for r, layout in enumerate(layouts) if layout != first)
        mine, theirs = (layouts[r]["states"] for r in (0, other))
        state = next((name for name in {**mine, **theirs} if mine.get(name) != theirs.get(name)), None)
        said = [f"{first['class']} on rank 0 but {layouts[other]['class']} on rank {other}" if
                layouts[other]["class"] != first["class"] else f"the state {state} {mine.get(state)} on rank 0 but "
                f"{theirs.get(state)} on rank {other} (reduction, dtype, shape)"]
    why = "their states have different shapes" if shapes else "their states hold different things (adding them " \
        "would give a wrong report)"
    return (f"{name}: the ranks' metrics were built with different arguments, so {why}: {'; '.join(said)}; construct "
            "the metric with the same arguments on every rank")


class Float64Metric(Metric):
    """A metric whose states (counts, sums, samples) are float64 and stay so, with a cheap ``forward``.

    - Module casts (``.to(torch.bfloat16)``, ``.half()``, Lightning's ``precision="bf16-true"``) move the states
      to their device but keep them float64: a bfloat16 count stops at 256. Only `set_dtype` changes their dtype.
    - ``forward`` (the batch's value, the batch added to the state) sets the state aside by reference, not by a
      copy (`reset` gives the batch fresh states, which every update replaces or adds into), and appends the
      batch's samples as ``update`` does (`append_samples`), not one tensor per call.
    - The states sync in a few collectives (`_sync_dist`) unless a ``dist_sync_fn`` is given.
    """

    def _apply(self, fn: Callable, exclude_state: Any = "") -> "Float64Metric":
        if self._dtype_convert:  # set_dtype
            return super()._apply(fn, exclude_state)

        def move(x: torch.Tensor) -> torch.Tensor:
            to = fn(x.new_empty(0))  # where and as what fn puts a tensor like x
            return fn(x) if to.dtype == x.dtype else x.to(to.device)

        dtype = self._dtype
        out = super()._apply(move, exclude_state)
        out._dtype = dtype
        return out

    def sync_settings(self) -> dict:
        """The arguments that decide what the states hold and how compute reads them, as JSON data (`_sync_dist`
        compares them across the ranks before anything else); a subclass adds its own to its parent's."""
        return {}

    def _layout(self) -> dict:
        """What the ranks must agree on to sync: the class, `sync_settings`, and each state's reduction (and, but for
        ``cat`` states, its dtype and shape)."""
        states = {attr: [getattr(fx, "__name__", None)] + ([] if fx is dim_zero_cat else [
            str(getattr(self, attr).dtype), list(getattr(self, attr).shape)]) for attr, fx in self._reductions.items()}
        return {"class": type(self).__qualname__, "settings": self.sync_settings(), "states": states}

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors, process_group: Optional[Any] = None) -> None:
        """Every rank's states, reduced as declared, in few collectives and no extra copy (torchmetrics' own sync,
        with a ``dist_sync_fn`` of the user's, gathers each state alone: two collectives and a barrier a state, the
        samples padded to the longest rank's and concatenated twice):

        - one ``all_gather`` of a fixed size (`SYNC_HEAD` + 1): a fingerprint of `_layout` (the arguments that
          decide the states, the states' shapes) and the ``cat`` states' numbers of samples (more than `SYNC_HEAD`
          states: the rest in a second). Fingerprints that differ raise a ValueError on every rank naming
          the argument (`mismatch`), before anything whose size depends on them: summing states built with other
          arguments would be a silent wrong report;
        - one ``all_gather`` per dtype of the other states, flat, each then reduced over the ranks (``sum``: the
          ranks' values added in rank order, as torchmetrics does);
        - per ``cat`` state (flat samples, as `append_samples` keeps them) one tensor of every rank's samples in rank
          order, each rank's ``broadcast`` straight into its slice (this rank's pieces copied into its own)."""
        if dist_sync_fn is not gather_all_tensors:
            return super()._sync_dist(dist_sync_fn, process_group)
        group = process_group or self.process_group or torch.distributed.group.WORLD
        world, me = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
        cats = [attr for attr, fx in self._reductions.items() if fx is dim_zero_cat]
        pieces = {}  # each cat state's samples: its list's tensors (a tensor of its own, as torchmetrics allows)
        for attr in cats:
            value = getattr(self, attr)
            pieces[attr] = [p.reshape(-1) for p in (value if isinstance(value, list) else [value])]
        others: dict[torch.dtype, list[str]] = {}
        for attr in self._reductions:
            if attr not in pieces:
                others.setdefault(getattr(self, attr).dtype, []).append(attr)
        layout = json.dumps(self._layout(), default=repr)  # (in the settings' order; a value JSON lacks: its repr)
        digest = hashlib.blake2b(layout.encode(), digest_size=8).digest()
        mine = [sum(p.numel() for p in pieces[attr]) for attr in cats]
        head = [int.from_bytes(digest, "little", signed=True)] + (mine + [0] * SYNC_HEAD)[:SYNC_HEAD]
        gathered = torch.empty((world, len(head)), dtype=torch.int64, device=self.device)
        torch.distributed.all_gather(list(gathered.unbind(0)), torch.tensor(head, dtype=torch.int64,
                                                                            device=self.device), group=group)
        gathered = gathered.tolist()
        if len({row[0] for row in gathered}) > 1:  # every rank sees it: each raises, none waits
            raise ValueError(mismatch(type(self).__name__, gather_json(json.loads(layout), group, self.device)))
        sizes = [row[1:1 + len(mine)] for row in gathered]  # [rank][cat state] (as many on every rank: same layout)
        if len(mine) > SYNC_HEAD:
            rest = torch.empty((world, len(mine) - SYNC_HEAD), dtype=torch.int64, device=self.device)
            torch.distributed.all_gather(list(rest.unbind(0)), torch.tensor(mine[SYNC_HEAD:], dtype=torch.int64,
                                                                              device=self.device), group=group)
            sizes = [row + more for row, more in zip(sizes, rest.tolist())]
        for attrs in others.values():
            flat = torch.cat([getattr(self, attr).reshape(-1) for attr in attrs])
            gathered = torch.empty((world, flat.numel()), dtype=flat.dtype, device=flat.device)
            torch.distributed.all_gather(list(gathered.unbind(0)), flat, group=group)
            at = 0
            for attr in attrs:
                shape = getattr(self, attr).shape
                value = gathered[:, at:at + shape.numel()].reshape(world, *shape)
                fx = self._reductions[attr]
                setattr(self, attr, fx(value) if fx is not None else value)
                at += shape.numel()
        for attr, counts in zip(cats, zip(*sizes)):
            starts = [sum(counts[:r]) for r in range(world + 1)]
            out = torch.empty(starts[-1], dtype=pieces[attr][0].dtype if pieces[attr] else self.dtype,
                              device=self.device)
            if counts[me]:
                torch.cat(pieces[attr], out=out[starts[me]:starts[me + 1]])
            for r in range(world):
                if counts[r]:
                    torch.distributed.broadcast(out[starts[r]:starts[r + 1]],
                                                torch.distributed.get_global_rank(group, r), group=group)
            setattr(self, attr, out)

    def _copy_state_dict(self) -> dict:
        return {attr: list(value) if isinstance(value, list) else value
                for attr, value in ((attr, getattr(self, attr)) for attr in self._defaults)}

    def _reduce_states(self, incoming_state: dict) -> None:
        super()._reduce_states(incoming_state)
        for attr in self._defaults:  # a list state: the incoming pieces, then this one's, merged as update merges
            pieces = getattr(self, attr)  # (pieces that already halve along the list are not copied again)
            if isinstance(pieces, list) and len(pieces) > 1:
                merged: list = []
                for piece in pieces:
                    append_samples(merged, piece)
                setattr(self, attr, merged)


class SampleMetric(Float64Metric):
    """Base of the quantile-based metrics: one switch between exact and constant-memory states.

    - ``mode="exact"`` (default): every sample kept (``cat`` states, float64, merged as they arrive into at
      most log2(n) + 1 tensors: `append_samples`); results equal numpy's.
    - ``mode="sketch"``: a signed log-bucketed histogram per quantity (``sum`` states of fixed size, about
      ``2 ln(max/min) / relative_accuracy`` buckets, whatever the number of samples). Each order statistic is
      within ``relative_accuracy`` (relative) of the exact one; IQM / CI are read from the buckets, within
      ``relative_accuracy`` of the mean magnitude of the middle values (plus the bootstrap's own noise).
      Magnitudes below ``sketch_range[0]`` count as 0, above ``sketch_range[1]`` as the top bucket.

    Bootstrap CIs use ``num_resamples`` resamples seeded with ``seed``, computed on the synced state. State names
    say what they hold and differ between classes, so that a ``MetricCollection`` never merges two metrics'
    states into one compute group.
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, mode: Mode = "exact", relative_accuracy: float = 0.005,
                 sketch_range: tuple[float, float] = (1e-4, 1e8), num_resamples: int = 1000, seed: int = 42,
                 **kwargs):
        super().__init__(**kwargs)
        if mode not in ("exact", "sketch"):
            raise ValueError(f"mode must be 'exact' or 'sketch', got {mode!r}")
        self.mode = mode
        self.spec = check_statistics(relative_accuracy, sketch_range, num_resamples, seed)
        self.num_resamples, self.seed = num_resamples, seed

    def sync_settings(self) -> dict:
        return {**super().sync_settings(), "mode": self.mode, "relative_accuracy": self.spec.relative_accuracy,
                "sketch_range": [self.spec.min_value, self.spec.max_value], "num_resamples": self.num_resamples,
                "seed": self.seed}

    def _add_sample_state(self, name: str) -> None:
        if self.mode == "exact":
            self.add_state(name, default=[], dist_reduce_fx="cat")
        else:
            self.add_state(name, default=torch.zeros(self.spec.size, dtype=torch.float64), dist_reduce_fx="sum")
        # an empty list state is synced as an empty tensor of the metric's dtype: make it the samples' dtype
        self._dtype = torch.float64

    def _push(self, name: str, values: torch.Tensor) -> None:
        """Add samples; NaN (an undefined error, e.g. a zero ground truth) is left out."""
        values = values.detach().reshape(-1).to(torch.float64)
        if self.mode == "exact":
            append_samples(getattr(self, name), values[~torch.isnan(values)])
        else:
            setattr(self, name, getattr(self, name) + sketch_counts(values, self.spec).to(self.device))

    def plot(self, val=None, ax=None):
        """Plot a result (or ``compute()``'s) with torchmetrics' plotting."""
        return self._plot(val, ax)

    def _distribution(self, name: str) -> Distribution:
        state = getattr(self, name)
        if self.mode == "sketch":
            return Distribution(counts=state, spec=self.spec)
        return Distribution.exact(cat_samples(state, self.device))
