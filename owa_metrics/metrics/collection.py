"""`OWAEventMetrics`: the whole report — decode once per batch, every metric in one pass, one flat dict out."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Literal, Optional, Sequence, Union

import numpy as np
import torch
from torchmetrics.utilities import rank_zero_warn

from ..decode import kernel as decode_kernel
from ..decode.batch import _check_inputs, _Tables, batch_of_arrays, check_pairing, decode_batch, kernel_arrays
from ..decode.event_batch import Alignment, Backend, EventBatch, Pairing
from ..decode.matching import DEFAULT_TOLERANCE_MS, tolerance_ns
from ..decode.screens import without_screen_events
from ..functional import kernel as compiled
from ..functional.d2e import DEFAULT_BIN_MS, bin_ns_of
from ..functional.declare import Given, GivenSamples, Samples, Shape, Sums
from ..functional.plan import SAMPLE_SHIFT, Plan, accumulate
from ..functional.report import REPORT, WORDS, default_tag_keys, headline_keys, higher_is_better
from ..functional.stats import distinct, distinct_by_group, sketch_counts
from ..functional.tokens import event_token_stats, field_table, given_token_losses, token_losses
from ..schema import CATEGORY_NAMES, Status
from ..tokens.codec import CodecConfig
from ..tokens.vocab import VocabMap
from .base import Distribution, Float64Metric, Mode, append_samples, cat_samples, check_statistics, gather_json


GeneratedScreens = Literal["context", "scored"]


class InvalidTargetsWarning(UserWarning):
    """More than 5 % of the target events do not decode: their share ``rate`` and most frequent failure ``reason``
    (a `Status` label), for callers that say it in their own words (the CLI)."""

    def __init__(self, rate: float, reason: str, message: str):
        self.rate, self.reason = rate, reason
        super().__init__(message)


class OWAEventMetrics(Float64Metric):
    """Every event metric of an OWA model, as one torchmetrics ``Metric``.

    ``OWAEventMetrics(tokenizer)`` takes any HF tokenizer that has the event tokens (or a `VocabMap`, in either
    argument).
    ``update(preds, target, logits=None)``: token ids [B, T] aligned position by position (teacher forcing:
    see `align_teacher_forcing`; generation: ``alignment="generation"``, ``preds`` the generated tokens), or an
    already decoded `EventBatch` as ``preds`` alone (every key but the token ones, which need the ids); ``logits``
    [B, T, V] aligned with ``target`` (on its device) add the per-category token loss, or (not both) ``token_loss``
    [B, T], the per-token cross-entropy aligned with ``target`` (a fused loss, or ``reduction="none"``; NaN / inf at
    a labelled position counts in ``count/loss_skipped_tokens``). ``compute()`` -> a flat dict of float64 scalars
    with ``/``-grouped keys and units in the names;
    keys without samples are left out (never NaN), counts are always there, and under teacher forcing the keys
    that apply to generation only (`owa_metrics.functional.report.GENERATION_ONLY`) are left out.

    Every key is declared once in `owa_metrics.functional.report` (``REPORT``, and what `register` adds): its
    states are this metric's, named there, all accumulated in one pass over the rows of a batch (torch ops, or
    on CPU tensors one compiled loop over the same plan: `owa_metrics.functional.plan`). Aggregates are
    per event (each event weighs the same, as the OWA metric spec); keys ending in ``_seq_macro`` average
    per sequence (each sequence weighs the same). Quantile-based metrics keep every sample
    (``mode="exact"``) or a fixed-size sketch (``mode="sketch"``, see `SampleMetric`). All states sync under
    DDP in one go: call ``compute()`` on every rank; it is never cached (``compute_with_cache=False``), so every
    call syncs whatever each rank did since the last, and the ranks share the report's work (`_definition_keys`;
    every rank returns the same report). ``persistent=True`` puts the states in ``state_dict()``
    (``torch.save`` / ``load_state_dict`` round-trip, also with ``weights_only`` loading). ``backend`` picks the
    decoder (`decode_batch`: the compiled CPU kernel for CPU tensors by default, else torch ops).

    Generation pairs the k-th generated event with the k-th true one (``pairing="index"``), or matches them
    within ``tolerance_ms`` (default 100) on the unwrapped time axis (``pairing="time"``, see
    `owa_metrics.decode.matching`; a ``tolerance_ms`` with index pairing, where it has no effect, is refused;
    ``update(..., origin_ns=)`` gives each row's origin, by default its first valid target event): the pairs feed
    every metric, and the detection matches add ``detect/{category}/precision|recall|f1``, the micro
    ``detect/precision|recall|f1``, ``detect/time_error_abs_p50_ms`` and ``count/invalid_pred_events``. A tuple
    ``tolerance_ms=(50, 100, 200, 500)`` sweeps: the detection matching runs at each tolerance t (keys
    ``detect/f1|precision|recall_within_{t}ms``, ``detect/{category}/f1_within_{t}ms``, ``detect/f1_mean``); the
    pairs and the keys above come from the first. The model predicts actions and is shown the screens: with
    ``generated_screens="context"`` (the default) both sides' screen events are left out before pairing
    (`without_screen_events`: whatever fills a generated screen's image span), every key is over the actions and
    no ``screen/*`` key is reported; ``"scored"`` pairs and scores them like actions (a model that predicts screen
    timing). Teacher forcing always scores the screens' labelled tokens.

    Slices: ``tags=["minecraft", "vscode", ...]`` (at most `MAX_TAGS` names) and ``update(..., tags=)``, one tag per
    sequence ([B] ids into ``tags``, or the names), keep every state by tag (the tag is the states' first axis, the
    pooled state their sum: every sequence has a tag); ``compute()`` adds, for each tag with a sequence on any rank,
    that tag's report under ``tag/{name}/...``: its sequences and target events and the headline keys
    (``tag_keys=None``: `default_tag_keys`), every key (``"all"``) or the keys named. A tag's keys are those of a
    metric fed only that tag's sequences: an update decodes and accumulates once, each row into its sequence's tag
    (every state family scattered by tag in the same ops, on both paths); the pooled keys stay.

    The D2E protocol (the D2E paper's binned metrics, `owa_metrics.functional.d2e`): ``bin_ms=50`` adds
    ``d2e/...`` (mouse Pearson and scale ratio, button and key accuracy over bins of each sequence's range, see
    docs/METRICS.md); ``empty_bins_as_correct`` as upstream's flag; ``bin_shifts=range(-3, 4)`` the keys at each
    shift of the prediction (``..._shift_{k}bins``) and ``d2e/best_shift_bins``. ``bin_ms="auto"`` (the default):
    50 in generation (the paper's setting: the model writes its events), off under teacher forcing (one prediction
    per true event, after the true events before it: the bins would re-score what the per-event keys do);
    ``bin_ms=None`` turns it off.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = None  # per key: `KeyDirections` (set below the class)

    def __init__(self, tokenizer=None, *, vocab: Optional[VocabMap] = None, config: Optional[CodecConfig] = None,
                 format: Optional[str] = None, alignment: Alignment = "teacher_forcing", mode: Mode = "exact", relative_accuracy: float = 0.005,
                 sketch_range: tuple[float, float] = (1e-4, 1e8), num_resamples: int = 1000, seed: int = 42,
                 persistent: bool = False, backend: Backend = "auto", pairing: Pairing = "index",
                 tolerance_ms: Union[None, float, tuple[float, ...]] = None, tags: Optional[Sequence[str]] = None,
                 tag_keys: Union[None, str, Sequence[str]] = None, bin_ms: Union[None, float, Literal["auto"]] = "auto",
                 empty_bins_as_correct: bool = False, bin_shifts: Sequence[int] = (),
                 generated_screens: GeneratedScreens = "context", **kwargs):
        kwargs.setdefault("compute_with_cache", False)  # every compute() syncs, on every rank: no stale rank
        super().__init__(**kwargs)
        self._syncs_here = False  # set by compute() while it syncs (`_wrap_compute`): the ranks share the report
        vocab = _vocab_map(vocab if vocab is not None else tokenizer, config, format)
        if alignment not in ("teacher_forcing", "generation"):
            raise ValueError(f"alignment must be 'teacher_forcing' or 'generation', got {alignment!r}")
        if mode not in ("exact", "sketch"):
            raise ValueError(f"mode must be 'exact' or 'sketch', got {mode!r}")
        if backend not in ("auto", "kernel", "torch"):
            raise ValueError(f"backend must be 'auto' (the CPU kernel for CPU tensors, else torch ops), 'kernel' or "
                             f"'torch', got {backend!r}")
        check_pairing(pairing, alignment, tolerance_ms)  # a tolerance_ms needs pairing="time"
        if generated_screens not in ("context", "scored"):
            raise ValueError(f"generated_screens must be 'context' (screens are what the model is shown: left out of "
                             f"the pairing and every key) or 'scored' (a model that predicts screen timing), got "
                             f"{generated_screens!r}")
        self.generated_screens = generated_screens
        if pairing == "time":  # the tolerance checked (raises saying what is allowed), kept in ns to compare
            tolerance_ms = DEFAULT_TOLERANCE_MS if tolerance_ms is None else tolerance_ms
            self._tolerance_ns = tolerance_ns(tolerance_ms, vocab.config.timestamp_window_ns)
        sweep = tuple(tolerance_ms) if isinstance(tolerance_ms, (tuple, list)) else ()
        self.pairing, self.tolerance_ms = pairing, sweep or tolerance_ms
        self.tags, self.tag_keys = _check_tags(tags), _check_tag_keys(tag_keys)
        self._tag_ids = {name: i for i, name in enumerate(self.tags)}
        self._tag_key_set = set(default_tag_keys(alignment) if tag_keys is None else
                                () if tag_keys == "all" else tag_keys)
        self.vocab, self.alignment, self.mode, self.backend = vocab, alignment, mode, backend
        self.spec = check_statistics(relative_accuracy, sketch_range, num_resamples, seed)
        self.num_resamples, self.seed = num_resamples, seed
        self.window_ns = vocab.config.timestamp_window_ns
        columns = vocab.config.token_format.digit_columns
        self.shape = Shape(columns.count("timestamp"), columns.count("dx"), self.window_ns, sweep,
                           *_check_d2e(bin_ms, empty_bins_as_correct, bin_shifts, alignment))
        self.definitions = tuple(d for d in REPORT if d.applies(alignment, pairing))
        self._field_table = field_table(vocab.config).numpy()
        plan = Plan.get(self.definitions, self.shape, "cpu", self._given_names(tokens=True))
        self._sampled_names = {n for n, st in plan.states.items() if isinstance(st, (Samples, GivenSamples))}
        sketches = plan.sketch_layout(self.spec.size)
        by_tag = (len(self.tags),) if self.tags else ()  # the tag axis: every state per tag, the pooled one their sum
        for name, state in plan.states.items():
            if isinstance(state, (Samples, GivenSamples)) and mode == "exact":  # flat float64 rows (NaN: not defined;
                self.add_state(self.kept(name), default=[], dist_reduce_fx="cat")  # with tags, the tag last in a row)
            else:
                shape = sketches[name] if isinstance(state, Samples) else (
                    (self.spec.size,) if isinstance(state, GivenSamples) else plan.state_shapes[name])
                self.add_state(self.kept(name), default=torch.zeros(by_tag + tuple(shape), dtype=torch.float64),
                               dist_reduce_fx="sum")
        self._dtype = torch.float64  # an empty list state syncs as an empty tensor of this dtype
        self.persistent(persistent)

    def sync_settings(self) -> dict:
        """The arguments that decide the states and the report (not ``backend`` or ``persistent``): the ranks'
        must be equal to sync (`Float64Metric._sync_dist`)."""
        config = {f"config.{f.name}": getattr(self.vocab.config, f.name) for f in dataclasses.fields(self.vocab.config)
                  if f.name != "format"}
        return {**super().sync_settings(), "format": self.vocab.config.format, "alignment": self.alignment,
                "mode": self.mode, "pairing": self.pairing, "tolerance_ms": self.tolerance_ms, "tags": list(self.tags),
                "tag_keys": self.tag_keys, "bin_ms": self.shape.bin_ms, "bin_shifts": list(self.shape.bin_shifts),
                "empty_bins_as_correct": self.shape.empty_bins_as_correct, "generated_screens": self.generated_screens,
                "relative_accuracy": self.spec.relative_accuracy, "sketch_range": [self.spec.min_value,
                                                                                   self.spec.max_value],
                "num_resamples": self.num_resamples, "seed": self.seed, **config}

    def kept(self, name: str) -> str:
        """The attribute of a declared state: a `Samples` / `GivenSamples` state's is ``{name}_samples`` (exact mode)
        or ``{name}_sketch``; any other's its name. With tags a state has the tag axis first ([tags, ...]; exact
        samples: each row ends in its tag), and the pooled state is the sum over it (every sequence has a tag)."""
        if name in self._sampled_names:
            name = f"{name}_{'samples' if self.mode == 'exact' else 'sketch'}"
        return name

    @property
    def _groups(self) -> int:
        """The groups of sequences the states are kept by: one per tag, or one."""
        return len(self.tags) or 1

    def _given_names(self, tokens: bool, loss: bool = True) -> tuple[str, ...]:
        """The `Given` states an update supplies: the token statistics (teacher forcing, with token ids; the loss with
        logits or a token loss), and every other one (read from the decoded batch: the detection counts, ...)."""
        names = ("token_fields",) + (("token_loss",) if loss else ()) if tokens and self.alignment == "teacher_forcing" \
            else ()
        return names + self._batch_given

    @functools.cached_property
    def _batch_given(self) -> tuple[str, ...]:
        return tuple(n for d in self.definitions for n, s in d.states(self.shape).items()
                     if isinstance(s, Given) and n not in ("token_fields", "token_loss"))

    # ------------------------------------------------------------------------------------------ update
    def update(self, preds: Union[torch.Tensor, EventBatch], target: Optional[torch.Tensor] = None,
               logits: Optional[torch.Tensor] = None, origin_ns: Union[None, int, torch.Tensor] = None,
               token_loss: Optional[torch.Tensor] = None, tags=None) -> None:
        if origin_ns is not None and self.pairing != "time":
            raise ValueError("origin_ns is the time origin of pairing='time': build OWAEventMetrics(..., "
                             "alignment='generation', pairing='time') to use it")
        if isinstance(preds, EventBatch):
            if tags is not None or self.tags:
                raise ValueError("tags slice the token ids: pass update(preds_ids, target_ids, tags=...) rather than "
                                 "an EventBatch")
            if target is not None or logits is not None or token_loss is not None:
                raise ValueError("update(EventBatch) takes the decoded batch alone: the token accuracy and loss need "
                                 "the token ids, so pass update(preds_ids, target_ids, logits=...) instead")
            if (preds.time_matching is not None) != (self.pairing == "time"):
                raise ValueError(f"this EventBatch was paired by {'time' if preds.time_matching else 'index'} but "
                                 f"the metric pairs by {self.pairing}: decode with decode_batch(..., "
                                 f"pairing='{self.pairing}') or build the metric with the batch's pairing")
            found = preds.time_matching  # the tolerance (sweep) it was matched at must be the metric's
            if found is not None and (found.sweep_ns or found.tolerance_ns) != self._tolerance_ns:
                raise ValueError(f"this EventBatch was matched at {_said_ms(found.sweep_ns or found.tolerance_ns)} "
                                 f"but the metric at {_said_ms(self._tolerance_ns)}: decode with decode_batch(..., "
                                 f"pairing='time', tolerance_ms={self.tolerance_ms}), or build the metric with the "
                                 "batch's tolerance")
            self._accumulate(preds, None)
        else:
            if target is None:
                raise ValueError("update(preds, target): target token ids are missing")
            if logits is not None and token_loss is not None:
                raise ValueError("pass logits= or token_loss= (the loss they give), not both")
            if logits is not None:
                _check_logits(logits, target, self.alignment)
            if token_loss is not None:
                _check_token_loss(token_loss, target, self.alignment)
            preds, target = _check_inputs(preds, target, self.alignment)  # [B, T] int64
            preds, target = self.scored_ids(preds, target)
            if logits is not None and logits.dim() == 2:
                logits = logits[None]
            if token_loss is not None:
                token_loss = torch.nn.functional.pad(token_loss.reshape(target.shape[0], -1).to(target.device),
                                                     (0, target.shape[1] - token_loss.shape[-1]))  # [B, 0]: one column
            group = self._tag_ids_of(tags, target.shape[0], target.device)
            self._update_ids(preds, target, logits, token_loss, origin_ns, group)

    def scored_ids(self, preds: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids ``update`` scores: in generation with ``generated_screens="context"`` both sides' screen events
        set to -100 (`without_screen_events`, both sides in one pass; one compiled pass per side on the CPU kernel
        path), else as given."""
        if not self._screens_are_context:
            return preds, target
        if self._compiled(target):
            return tuple(without_screen_events(x, self.vocab, True) for x in (preds, target))
        width, B = max(preds.shape[1], target.shape[1]), preds.shape[0]
        pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]), value=-100)  # noqa: E731
        both = without_screen_events(torch.cat([pad(preds), pad(target)]), self.vocab)
        return both[:B, :preds.shape[1]], both[B:, :target.shape[1]]

    @property
    def _screens_are_context(self) -> bool:
        return self.alignment == "generation" and self.generated_screens == "context"

    def _update_ids(self, preds: torch.Tensor, target: torch.Tensor, logits: Optional[torch.Tensor],
                    token_loss: Optional[torch.Tensor], origin_ns, group: Optional[torch.Tensor] = None) -> None:
        """Decode and accumulate checked ids, once: into each sequence's tag (``group`` [B]: its tag id) with tags."""
        if self._compiled(target):
            self._update_compiled(preds, target, logits, token_loss, group)
            return
        batch = decode_batch(preds, target, self.vocab, self.alignment, self.backend, self.pairing,
                             self.tolerance_ms, origin_ns)
        tokens = None  # teacher forcing: `event_token_stats`
        if self.alignment == "teacher_forcing":
            tokens = event_token_stats(batch, preds, target, self.vocab.config, logits, token_loss, group, self._groups)
        self._accumulate(batch, tokens, group)

    def _tag_ids_of(self, tags, batch_size: int, device) -> Optional[torch.Tensor]:
        """Each sequence's tag id [B] on ``device`` (None without tags; one host read of the ids); raises on misuse."""
        if tags is None or not self.tags:
            if tags is not None:
                raise ValueError("update(..., tags=) needs the tags' names up front: OWAEventMetrics(..., "
                                 "tags=['minecraft', 'vscode', ...])")
            if self.tags:
                raise ValueError(f"this metric reports per tag ({len(self.tags)} tags): pass update(..., tags=) with "
                                 "one tag per sequence (ids into tags, or the names), in every update")
            return None
        if isinstance(tags, (list, tuple, np.ndarray)) and all(isinstance(t, str) for t in tags):  # or empty
            unknown = sorted(set(tags) - self._tag_ids.keys())
            if unknown:
                raise ValueError(f"tags {unknown} are not among this metric's tags {self.tags}: name every tag "
                                 "of the data in OWAEventMetrics(..., tags=)")
            tags = torch.tensor([self._tag_ids[t] for t in tags], dtype=torch.long)  # [] too: no ids, no float
        try:
            ids = torch.as_tensor(tags).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            ids = None
        if ids is None or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool or \
                ids.numel() != batch_size:
            raise ValueError(f"tags must be {batch_size} integer ids (one per sequence) or names, got {tags!r}"[:300])
        ids = ids.cpu().long()
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < len(self.tags):
            raise ValueError(f"tag ids must be in [0, {len(self.tags)}) (indices into tags={self.tags}), got "
                             f"{sorted(set(ids.tolist()))}")
        return ids.to(device)

    def _accumulate(self, batch: EventBatch, tokens, group: Optional[torch.Tensor] = None) -> None:
        """Every state from a decoded batch with torch ops (`owa_metrics.functional.plan.accumulate`), added in one
        ``_foreach_add_`` (with the sketch counts in sketch mode, and the given sums); exact mode reads the numbers of
        sampled rows in one host sync, then selects them. ``group``: each sequence's tag: every state family by tag in
        the same ops."""
        names = self._given_names(tokens is not None, tokens is not None and tokens.loss_sum is not None)
        plan = Plan.get(self.definitions, self.shape, batch.seq_idx.device, names)
        sketch = self.mode == "sketch" and plan.samples
        G = self._groups
        increments, samples, sampled, key, row_group = accumulate(plan, batch, plan.sketch_tables[0] if sketch else None,
                                                                  group, G)
        states = self._flat_states([self.kept(name) for name in plan.sums_states])
        increments, counts = increments[:-1], increments[-1]
        if sketch:
            _, rows, n_rows = plan.sketch_tables
            cell = rows.index_select(0, key)
            if row_group is None:
                flat = sketch_counts(samples, self.spec, cell, n_rows + 1)
                states += self._flat_states([self.kept(name) for name in plan.samples])
                increments += flat.view(1, -1).split([getattr(self, self.kept(name)).numel() for name in plan.samples]
                                                     + [self.spec.size], 1)[:-1]  # the last: no state's group
            else:
                self._sketch_by_tag(plan, samples, cell, n_rows, row_group)
        extras = {"tokens": tokens, "group": group, "groups": G}
        given = [piece for name in plan.given for piece in plan.states[name].fn(batch, extras)]
        views = self._given_views(plan)
        self._check_by_tag(plan, given, views)
        torch._foreach_add_(states + views, increments + given)
        rows = self.mode == "exact" and plan.samples
        values, tags, kept, sizes = self._given_samples(
            plan, batch, extras, (counts if row_group is None else counts.sum(0)) if rows else None, len(samples))
        if rows:
            self._append_rows(plan, samples, sampled, sizes[:len(plan.samples)], row_group)
        self._add_given_samples(plan, values, tags, kept, sizes[len(plan.samples) if rows else 0:])

    def _sketch_by_tag(self, plan: Plan, samples: torch.Tensor, cell: torch.Tensor, n_rows: int,
                       row_group: torch.Tensor) -> None:
        """With tags, the sketched values counted in place (no dense increment of tags x the sketches): per `Samples`
        state one ``index_add_`` of its columns (``cell``: each one's sketch row, ``n_rows``: none) into the rows of
        the row's tag."""
        size, counted = self.spec.size, (~torch.isnan(samples) & (cell < n_rows)).double()
        bucket = self.spec.index(torch.nan_to_num(samples))
        column, base = 0, 0
        for name, state in plan.samples.items():
            target = getattr(self, self.kept(name))
            per_tag, width = target[0].numel() // size, len(state.values) * (2 if state.by_category else 1)
            local = (cell[:, column:column + width] - base).clamp(0, per_tag - 1) + row_group[:, None] * per_tag
            target.view(-1).index_add_(0, (local * size + bucket[:, column:column + width]).reshape(-1),
                                       counted[:, column:column + width].reshape(-1))
            column, base = column + width, base + per_tag

    def _append_rows(self, plan: Plan, samples: torch.Tensor, sampled: torch.Tensor, sizes: list[int],
                     row_group: Optional[torch.Tensor] = None) -> None:
        """Each `Samples` state's rows: the rows of its group (``sizes``: their numbers, `_given_samples`), its values
        (then, with tags, the row's tag)."""
        rows = torch.nonzero_static(sampled.T, size=sum(sizes))[:, 1].split(sizes)
        for name, chosen, values in zip(plan.samples, rows, samples.split(plan.sample_widths, 1)):
            if row_group is not None:
                values = torch.cat([values, row_group[:, None].to(values.dtype)], 1)
            append_samples(getattr(self, self.kept(name)), values.index_select(0, chosen).reshape(-1))

    def _given_samples(self, plan: Plan, batch: EventBatch, extras: dict, counts: Optional[torch.Tensor] = None,
                       n_rows: int = 0) -> tuple[list, list, list[torch.Tensor], list[int]]:
        """``(values, tags, kept, sizes)``: the `GivenSamples` states' values (NaN: no sample), with tags each value's
        tag (else None), and, in exact mode, which are kept (not NaN) and, in one host sync, the numbers of sampled
        rows of each `Samples` state (``counts``, packed: see `Plan.sample_counts`; ``n_rows`` rows) when given, then
        of each given state's kept values."""
        given = [plan.states[name].fn(batch, extras) for name in plan.given_samples]
        given = [(g, None) if isinstance(g, torch.Tensor) else g for g in given]  # values alone: no tags
        if self.tags and any(seq is None for _, seq in given):
            raise ValueError(f"the GivenSamples states {[n for n, (_, q) in zip(plan.given_samples, given) if q is None]}"
                             " give their values without their sequences: with tags, return (values, seq) from the "
                             "state's fn (seq: the sequence of each value, in the batch)")
        values = [x.to(self.device, torch.float64) for x, _ in given]
        group = extras.get("group")
        tags = [None if group is None else group.index_select(0, seq.long()) for _, seq in given]
        if self.mode == "sketch" or (counts is None and not values):
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

    def _add_given_samples(self, plan: Plan, values: list[torch.Tensor], tags: list, kept: list[torch.Tensor],
                           sizes: list[int]) -> None:
        """The `GivenSamples` states' ``values`` (`_given_samples`): counted in the sketch, or their ``kept`` ones
        (``sizes`` of them) kept; with tags, by the tag of each one's sequence (rows (value, tag))."""
        for k, (name, x, tag) in enumerate(zip(plan.given_samples, values, tags)):
            state = getattr(self, self.kept(name))
            if self.mode == "sketch":
                state.add_(sketch_counts(x, self.spec, tag, self._groups))
                continue
            at = torch.nonzero_static(kept[k], size=sizes[k])[:, 0]
            rows = x.index_select(0, at)
            if tag is not None:
                rows = torch.stack([rows, tag.index_select(0, at).to(x.dtype)], 1).view(-1)
            append_samples(state, rows)

    def _check_by_tag(self, plan: Plan, pieces: list, views: list) -> None:
        """With tags, raise unless every `Given` piece has the tag axis (a piece without it would be added to every
        tag: a silent wrong number)."""
        if self.tags and any(p.dim() != v.dim() for p, v in zip(pieces, views)):
            raise ValueError(f"a Given state of {list(plan.given)} gives sums without the tag axis: with tags its fn "
                             "must return them by tag, [extras['groups'], ...] (see declare.per_group)")

    def _flat_states(self, names: list[str]) -> list[torch.Tensor]:
        """Views [groups, -1] of the named states: the additions of `_accumulate` go through them without a view op."""
        G = self._groups
        return [view for name in names for view in self._views(name, "flat", lambda state: [state.view(G, -1)])]

    def _given_views(self, plan: Plan) -> list[torch.Tensor]:
        """The views ``state[part]`` that the `Given` states' pieces add to (with tags ``state[:, part]``)."""
        axis = (slice(None),) if self.tags else ()
        return [view for name in plan.given for view in self._views(
            self.kept(name), "parts", lambda state: [state[axis + tuple(p)] for p in plan.states[name].parts])]

    def _views(self, name: str, kind: str, make) -> list[torch.Tensor]:
        """``make(state)``'s views of a state, kept while the state is the same tensor (`reset` and syncs replace
        it): no view op per state and update."""
        cache = self.__dict__.setdefault("_views_cache", {})
        state = getattr(self, name)
        if (name, kind) not in cache or cache[name, kind][0] is not state:
            cache[name, kind] = (state, make(state))
        return cache[name, kind][1]

    def _compiled(self, target: torch.Tensor) -> bool:
        """Whether this update runs the compiled CPU kernels (screens as context, decode, accumulate, token statistics)."""
        if self.backend == "torch" or self.device.type != "cpu" or self.pairing == "time":
            return False
        return self.backend == "kernel" or (target.device.type == "cpu" and decode_kernel.available())

    def _update_compiled(self, preds: torch.Tensor, target: torch.Tensor, logits: Optional[torch.Tensor],
                         token_loss: Optional[torch.Tensor] = None, group: Optional[torch.Tensor] = None) -> None:
        """The same states as `_accumulate`, from compiled loops: `kernel.decode_arrays` over the tokens, then
        `functional.kernel.accumulate` over the rows with the same plan (and `token_stats` under teacher forcing),
        each row into its sequence's tag (``group``) in the same loop."""
        out = kernel_arrays(preds, target, self.vocab, self.alignment, _Tables.get(self.vocab.config, target.device))
        whole, with_loss, G = {}, logits is not None or token_loss is not None, self._groups
        seq_group = np.zeros(target.shape[0], dtype=np.int64) if group is None else group.numpy()
        if self.alignment == "teacher_forcing":
            t = out["target"]
            by_row = group is not None
            losses, skipped = (token_losses(logits, target, by_row=by_row) if logits is not None else
                               given_token_losses(token_loss, target, by_row=by_row) if token_loss is not None else
                               (torch.zeros(1), 0))
            fields, loss = np.zeros(self.token_fields.shape), np.zeros(self.token_loss.shape)
            compiled.token_stats(out["seq"], t["status"], t["kind"], t["values"], t["start"], t["end"], t["start_cut"],
                                 target.shape[1], target.numpy().reshape(-1), preds.numpy().reshape(-1),
                                 self._field_table, losses.numpy(), with_loss, seq_group,
                                 fields.reshape(G, *fields.shape[-2:]), loss.reshape(G, -1))
            # the loop adds the valid targets' loss by category: the last column is free
            loss[..., -1] = np.bincount(seq_group, skipped.numpy(), G) if by_row and with_loss else skipped
            whole = {"token_fields": torch.from_numpy(fields), "token_loss": torch.from_numpy(loss)}
        plan = Plan.get(self.definitions, self.shape, "cpu", self._given_names(self.alignment == "teacher_forcing",
                                                                               with_loss))
        # the other given states read the decoded batch: its arrays as an `EventBatch` (no copy)
        batch = batch_of_arrays(out, self.shape.n_timestamp_digits, target.shape[0], self.alignment) \
            if set(plan.given) - set(whole) or plan.given_samples else None
        extras = {"tokens": None, "group": group, "groups": G, "host_reads": True}
        axis = (slice(None),) if self.tags else ()
        pieces = [piece for name in plan.given for piece in (  # as declared
            [whole[name][axis + tuple(part)] for part in plan.states[name].parts] if name in whole else
            plan.states[name].fn(batch, extras))]
        increments, samples, row_groups = compiled.accumulate(plan, out, self.mode == "sketch", self.spec,
                                                              None if group is None else seq_group, G)
        states = list(plan.sums_states) + (list(plan.samples) if self.mode == "sketch" and group is None else [])
        views = self._given_views(plan)
        self._check_by_tag(plan, pieces, views)
        torch._foreach_add_(self._flat_states([self.kept(n) for n in states]) + views, increments + pieces)
        if self.mode == "sketch" and group is not None:  # counted in place, by tag
            compiled.sketch_by_group(plan, samples, row_groups, self.spec,
                                     [getattr(self, self.kept(n)) for n in plan.samples])
        if self.mode == "exact":
            for name, values, tag in zip(plan.samples, samples, row_groups):
                if group is not None:  # each row's tag last
                    values = torch.cat([values, tag[:, None].to(values.dtype)], 1)
                append_samples(getattr(self, self.kept(name)), values.reshape(-1))
        self._add_given_samples(plan, *self._given_samples(plan, batch, extras))

    # ----------------------------------------------------------------------------------------- compute
    def _wrap_compute(self, compute):
        """torchmetrics' compute (sync, then compute), without its "called before update" warning: a rank or an
        epoch without batches is fine (counts are 0, the other keys left out)."""
        wrapped = super()._wrap_compute(compute)

        @functools.wraps(wrapped)
        def quiet(*args, **kwargs):
            self._syncs_here = self._to_sync and not self._is_synced  # a sync in this call: every rank joins it
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
                    return wrapped(*args, **kwargs)
            finally:
                self._syncs_here = False

        return quiet

    def compute(self) -> dict[str, torch.Tensor]:
        reads = {None: Read(self)}  # the pooled states, and each tag with a sequence (on some rank)
        reads.update((tag, read) for tag, read in ((tag, Read(self, tag)) for tag in range(len(self.tags)))
                     if read["batch_counts"].raw[0] > 0)
        keys = self._definition_keys(reads)
        out = keys[None]
        self._warn_invalid_targets(out["status/invalid_target_rate"])
        if self.tag_keys not in (None, "all") and set(self.tag_keys) - out.keys():
            rank_zero_warn(f"tag_keys names {sorted(set(self.tag_keys) - out.keys())}, which this report does not "
                           "hold (a misspelt key, or no samples for it yet): see docs/METRICS.md for the keys")
        for tag in list(reads)[1:]:
            out.update({f"tag/{self.tags[tag]}/{k}": v for k, v in keys[tag].items() if self._is_tag_key(k)})
        out = {k: torch.as_tensor(v, dtype=torch.float64).to(self.device) for k, v in out.items()
               if not bool(torch.isnan(torch.as_tensor(v)))}
        return out

    def plot(self, val=None, ax=None, keys: Optional[Sequence[str]] = None):
        """Draw the headline keys (`headline_keys`, or ``keys``), a panel each with torchmetrics' plotting (its
        direction marked): a point for one result (``val``, else ``compute()``), a line over steps for several (a
        list of results, or `MetricTracker.compute_all`'s stacked dict). ``ax``: one matplotlib axes per key.
        Returns ``(figure, axes)``."""
        import matplotlib.pyplot as plt
        from torchmetrics.utilities.plot import plot_single_or_multi_val

        val = self.compute() if val is None else val
        steps = list(val) if isinstance(val, (list, tuple)) else None
        first = steps[0] if steps else val
        wanted = list(keys or headline_keys(self.alignment))
        keys = [k for k in wanted if k in first]
        if not keys:
            raise ValueError(f"nothing to plot: the result holds none of the keys {wanted} (pass a report of "
                             "OWAEventMetrics.compute(), a list of them, or MetricTracker.compute_all()'s)")
        if ax is None:
            cols = min(4, len(keys))
            fig, ax = plt.subplots((len(keys) + cols - 1) // cols, cols, figsize=(3.2 * cols, 2.6 * -(-len(keys) // cols)),
                                   squeeze=False)
            for extra in ax.flat[len(keys):]:
                extra.set_visible(False)
        else:
            fig = None
        axes = list(getattr(ax, "flat", ax if isinstance(ax, (list, tuple)) else [ax]))
        if len(axes) < len(keys):
            raise ValueError(f"plot(ax=...) needs one axes per key: {len(keys)} keys ({keys}), {len(axes)} axes")
        for key, panel in zip(keys, axes):
            series = [torch.as_tensor(s[key]) for s in steps] if steps else torch.as_tensor(first[key])
            if not steps and series.dim() == 1:  # compute_all's rows: one value per step
                series = list(series)
            plot_single_or_multi_val(series, ax=panel, higher_is_better=higher_is_better(key),
                                     name=key.rsplit("/", 1)[-1])
            panel.set_title(WORDS.get(key, key), fontsize=9)
        if fig is not None:
            fig.tight_layout()
        return fig or axes[0].figure, ax

    def _definition_keys(self, reads: dict) -> dict:
        """Each read's keys (``reads``: scope -> `Read`; None the pooled states, else a tag's index): every
        definition's, and the invalid-target rate. Where this ``compute()`` synced the states (every rank holds the
        same ones and is in this call: `_wrap_compute`), the ranks share the work (`deal`): each computes its
        (scope, definition) pairs, and `gather_json` gives every rank every pair's keys (as floats: the same
        values, whichever rank computed them); an error on any rank is raised on every rank."""
        work = [(scope, d) for scope in reads for d in range(len(self.definitions))]
        group = (self.process_group or torch.distributed.group.WORLD) if self._syncs_here and self._is_synced else None
        world = torch.distributed.get_world_size(group) if group is not None else 1
        if world > 1:  # a pair's cost: its definition's samples, times its scope's share of the sequences
            sequences = {scope: float(read["batch_counts"].raw[0]) for scope, read in reads.items()}
            costs = [self._sample_count(self.definitions[d]) * sequences[scope] / max(sequences[None], 1)
                     for scope, d in work]
            work = deal(work, costs, world)[torch.distributed.get_rank(group)]
        done, error = {}, None
        try:
            for scope, d in work:
                done[scope, d] = self.definitions[d].compute(reads[scope])
        except Exception as err:  # noqa: BLE001 - raised below on every rank, not left to hang the others
            if world == 1:
                raise
            error = err
        if world > 1:
            mine = [[scope, d, {k: float(v) for k, v in keys.items()}] for (scope, d), keys in done.items()]
            every = gather_json([None if error is None else repr(error), mine], group, self.device)
            if error is not None:
                raise error
            failed = [(rank, said) for rank, (said, _) in enumerate(every) if said is not None]
            if failed:
                raise RuntimeError(f"{type(self).__name__}.compute() failed on rank {failed[0][0]}: {failed[0][1]}")
            done = {(scope, d): keys for _, part in every for scope, d, keys in part}
        out = {}
        for scope, read in reads.items():
            keys = {}
            for d in range(len(self.definitions)):
                keys.update(done[scope, d])
            events = read["events"].events.clamp(min=1)
            keys["status/invalid_target_rate"] = read["statuses"].raw[0, int(Status.INVALID_TARGET)] / events
            if self._screens_are_context:  # no screen event was scored: no screen key (its count and ratio would be 0)
                keys = {k: v for k, v in keys.items() if not k.startswith(("screen/", "detect/screen/"))}
            out[scope] = keys
        return out

    def _sample_count(self, definition) -> int:
        """How many sample values ``definition``'s states hold (its compute's cost, for `deal`)."""
        return sum(sum(p.numel() for p in (v if isinstance(v, list) else [v]))
                   for v in (getattr(self, self.kept(n)) for n in definition.states(self.shape) if n in self._sampled_names))

    def _is_tag_key(self, key: str) -> bool:
        """Whether a tag reports ``key``: `default_tag_keys` (``tag_keys=None``), all, or those named."""
        return self.tag_keys == "all" or key in self._tag_key_set

    def _warn_invalid_targets(self, rate: torch.Tensor, threshold: float = 0.05) -> None:
        """Above ``threshold`` of invalid targets / target events, one warning on rank zero naming the most frequent
        decode failure and the likely fix."""
        if float(rate) > threshold:
            failures = Read(self).given("target_statuses")[0].clone()
            failures[int(Status.VALID)] = 0
            reason = Status(int(failures.argmax())).label
            rank_zero_warn(InvalidTargetsWarning(float(rate), reason, (
                f"{float(rate):.0%} of the target events do not decode (most often: {reason}); they are left out of "
                f"every rate. This metric reads the {self.vocab.describe()}: if the labels are in the other format, "
                "pass format='hierarchical' | 'factorized'; if screens use other image tokens, pass a CodecConfig with "
                "your image_prefix / image_token / image_suffix (or let the tokenizer's be detected by not passing "
                "config). status/invalid_target_rate logs this rate.")))

    def extra_repr(self) -> str:
        pairing = f", pairing={self.pairing}, tolerance_ms={self.tolerance_ms}" if self.pairing == "time" else ""
        screens = f", generated_screens={self.generated_screens}" if self.alignment == "generation" else ""
        return f"{self.vocab.describe()}, alignment={self.alignment}{pairing}{screens}, mode={self.mode}"

    def error_histograms(self, bins: int = 50) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{name: (counts, edges)}`` of the signed timestamp error (ms), the mouse signed percent errors and
        the direction error (deg) over all ranks (call on every rank). The range shows the bulk: P2..P98 of the
        values, narrowed to Tukey's fences (Q1 - 1.5 IQR, Q3 + 1.5 IQR); values outside it count in the edge bins."""
        with self.sync_context():
            read = Read(self)
            named = {"timestamp/signed_error_ms": read.samples("timestamp", "signed_error_ms"),
                     "mouse/signed_pe_x_pct": read.samples("mouse", "signed_pe_x"),
                     "mouse/signed_pe_y_pct": read.samples("mouse", "signed_pe_y"),
                     "mouse/direction_error_deg": read.samples("mouse", "direction_deg")}
            out = {}
            for name, dist in named.items():
                if dist.count == 0:
                    continue
                low, q1, q3, high = (float(v) for v in dist.quantile([0.02, 0.25, 0.75, 0.98]))
                if q3 > q1:
                    low, high = max(low, q1 - 1.5 * (q3 - q1)), min(high, q3 + 1.5 * (q3 - q1))
                values, weights = (t.cpu().numpy() for t in dist.distinct())
                high = high if high > low else low + 1
                out[name] = np.histogram(np.clip(values, low, high), bins=bins, range=(low, high), weights=weights)
            return out

    def confusion_matrix(self, sync: bool = True) -> torch.Tensor:
        """Category confusion counts over all ranks (call on every rank; ``sync=False``: this process's alone, e.g.
        one rank's own pass): rows are the target categories (keyboard, mouse_op, mouse_nop, screen), columns the
        predicted ones and a last ``invalid`` column."""
        with self.sync_context(should_sync=sync):
            return Read(self).given("confusion").clone()


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
    """What a `Definition`'s compute reads: the (synced) states of an `OWAEventMetrics` by name."""

    def __init__(self, metric: OWAEventMetrics, tag: Optional[int] = None):
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


MAX_TAGS = 64  # every state has a row per tag: sketch mode ~0.7 MB per tag; exact mode keeps each sample once


def _check_tags(tags) -> tuple[str, ...]:
    """The tags' names, checked: distinct non-empty printable strings without ``/`` (they name keys and table rows: a
    line break or other control character would split them), at most `MAX_TAGS`."""
    if tags is None:
        return ()
    if isinstance(tags, str) or not all(is_tag_name(t) for t in tags) or not tags:
        raise ValueError(f"tags must be a list of names (non-empty printable strings without '/': no line break, "
                         f"tab or other control character), got {tags!r}")
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags must be distinct names, got {list(tags)}")
    if len(tags) > MAX_TAGS:
        raise ValueError(f"{len(tags)} tags: at most {MAX_TAGS} (each tag keeps its own row of every state, ~0.7 MB "
                         "in sketch mode); group rare tags into one (e.g. 'other')"
                         " or slice by a coarser label")
    return tuple(tags)


def is_tag_name(name) -> bool:
    """Whether ``name`` can name a tag: a non-empty printable string without ``/`` (`str.isprintable`)."""
    return isinstance(name, str) and bool(name) and "/" not in name and name.isprintable()


def _check_tag_keys(tag_keys):
    """``None`` (the headline keys and the counts), ``"all"``, or key names."""
    if tag_keys is None or tag_keys == "all":
        return tag_keys
    if isinstance(tag_keys, str) or not tag_keys or not all(isinstance(k, str) for k in tag_keys):
        raise ValueError(f"tag_keys must be None (the headline keys and the counts), 'all' or a list of report keys, "
                         f"got {tag_keys!r}")
    return tuple(tag_keys)


def _said_ms(tolerance_ns: Union[int, tuple]) -> str:
    """A tolerance (ns) or a sweep of them in words: ``tolerance 100 ms``, ``tolerance sweep (50, 100) ms``."""
    if isinstance(tolerance_ns, tuple):
        return f"tolerance sweep ({', '.join(f'{t / 1e6:g}' for t in tolerance_ns)}) ms"
    return f"tolerance {tolerance_ns / 1e6:g} ms"


def _check_d2e(bin_ms, empty_bins_as_correct, bin_shifts, alignment: Alignment) -> tuple:
    """``(bin_ms, bin_shifts, empty_bins_as_correct)`` of the D2E protocol, checked (shifts without bins refused);
    ``bin_ms="auto"``: `DEFAULT_BIN_MS` in generation, None (off) under teacher forcing."""
    if isinstance(bin_ms, str) and bin_ms == "auto":
        bin_ms = DEFAULT_BIN_MS if alignment == "generation" else None
    if bin_ms is None:
        if tuple(bin_shifts) or empty_bins_as_correct:
            raise ValueError("bin_shifts / empty_bins_as_correct belong to the D2E protocol: pass bin_ms too "
                             "(upstream's is 50)")
        return None, (), False
    bin_ns_of(bin_ms)
    whole = lambda k: isinstance(k, (int, np.integer)) and not isinstance(k, bool)  # noqa: E731
    if isinstance(bin_shifts, (str, bytes)) or not hasattr(bin_shifts, "__iter__") or not all(map(whole, bin_shifts)):
        raise ValueError(f"bin_shifts must be whole numbers of bins, e.g. range(-3, 4), got {bin_shifts!r}")
    return float(bin_ms), tuple(int(k) for k in bin_shifts), bool(empty_bins_as_correct)


def _vocab_map(vocab, config: Optional[CodecConfig], format: Optional[str]) -> VocabMap:
    """A `VocabMap` as given, or one read from a tokenizer (`VocabMap.from_tokenizer`)."""
    if vocab is None:
        raise ValueError("OWAEventMetrics needs the model's tokenizer (with the event tokens) or vocab=VocabMap")
    return vocab if isinstance(vocab, VocabMap) else VocabMap.from_tokenizer(vocab, config, format)


def _check_logits(logits, target, alignment: Alignment) -> None:
    """Raise unless ``logits`` are floating [B, T, V > 0] aligned with ``target`` on its device (teacher forcing)."""
    if alignment != "teacher_forcing":
        raise ValueError("logits give the token loss under teacher forcing only; with alignment='generation' "
                         "pass the generated ids and the target ids alone")
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor [B, T, V], got "
                        f"{getattr(logits, 'dtype', type(logits).__name__)}")
    shape = tuple(getattr(target, "shape", ()))
    if tuple(logits.shape[:-1]) != shape or logits.shape[-1] == 0:
        raise ValueError(f"logits {tuple(logits.shape)} must be [B, T, V] (V > 0: the vocabulary) aligned with "
                         f"target {shape}")
    if isinstance(target, torch.Tensor) and logits.device != target.device:
        raise ValueError(f"logits on {logits.device} and target on {target.device}: put the logits on the ids' device")


def _check_token_loss(token_loss, target, alignment: Alignment) -> None:
    """Raise unless ``token_loss`` is a floating [B, T] aligned with ``target`` on its device (teacher forcing)."""
    if alignment != "teacher_forcing":
        raise ValueError("token_loss gives the token loss under teacher forcing only; with alignment='generation' "
                         "pass the generated ids and the target ids alone")
    shape = tuple(getattr(target, "shape", ()))
    if not isinstance(token_loss, torch.Tensor) or not token_loss.is_floating_point() or tuple(token_loss.shape) != shape:
        raise ValueError(f"token_loss {tuple(getattr(token_loss, 'shape', ()))} / {getattr(token_loss, 'dtype', None)} "
                         f"must be a float tensor [B, T] aligned with target {shape}")
    if isinstance(target, torch.Tensor) and token_loss.device != target.device:
        raise ValueError(f"token_loss on {token_loss.device} and target on {target.device}: put it on the ids' device")


class KeyDirections(dict):
    """`OWAEventMetrics.higher_is_better`, per key as torchmetrics allows for collections: True where a higher value
    is better, False where a lower one is, None where neither (a count, a share, a signed error): the named keys
    (`WORDS`) listed, any key answered by its name (`owa_metrics.functional.report.BETTER`)."""

    def __missing__(self, key: str):
        return higher_is_better(key)


OWAEventMetrics.higher_is_better = KeyDirections({key: higher_is_better(key) for key in WORDS})
