"""`OWAEventMetrics`: the whole report — decode once per batch, every metric in one pass, one flat dict out."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Optional, Union

import numpy as np
import torch
from torchmetrics.utilities import rank_zero_warn

from ..decode import kernel as decode_kernel
from ..decode.batch import KIND_CODES, _check_inputs, _Tables, check_pairing, decode_batch, kernel_arrays
from ..decode.event_batch import VALUE_COLUMNS, Alignment, Backend, EventBatch, Pairing, TimeMatching
from ..decode.matching import tolerance_ns
from ..schema import CATEGORY_NAMES, Category, Status
from ..functional.events import (
    EVENT_COUNTS, detection_report, event_type_report, keyboard_report, mouse_action_report, movement_r2_report, ratio,
)
from ..functional import kernel as fused
from ..functional.stats import distinct_by_group, sketch_counts
from ..functional.tokens import (
    TOKEN_FIELDS, EventTokenStats, event_token_stats, field_table, given_token_losses, token_losses, token_report,
)
from ..tokens.codec import CodecConfig
from ..tokens.vocab import VocabMap
from .base import Distribution, Float64Metric, Mode, append_samples, cat_samples, check_statistics

N_CAT = len(CATEGORY_NAMES)
GROUPS = ("all", *CATEGORY_NAMES)  # timestamp metrics: over all comparable events, then per category
TIMESTAMP_COLUMNS = ("signed_error_ms", "percent_error", "category")
MOUSE_COLUMNS = ("euclidean_pe", "signed_pe_x", "signed_pe_y", "direction_deg")
# keys that say something only when the predicted events are generated: under teacher forcing every target event
# has exactly one prediction, so these would be constants (count_accuracy 1, pred_events = target_events, 0, 0, 0)
GENERATION_ONLY = ("count_accuracy", "count/pred_events", "count/extra_events", "count/missing_events",
                   "status/missing")


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
    that apply to generation only (`GENERATION_ONLY`) are left out.

    The definitions are those of the single metrics (`TimestampError`, `IQMPE`, `DirectionError`,
    `DigitPrecisionAccuracy`, `KeyboardAccuracy`, `MouseActionAccuracy`, `MovementR2`, `EventTypeMetrics`,
    `EventTokenMetrics`), computed here in one pass over the comparable events of a batch. Aggregates are
    per event (each event weighs the same, as the OWA metric spec); keys ending in ``_seq_macro`` average
    per sequence (each sequence weighs the same). Quantile-based metrics keep every sample
    (``mode="exact"``) or a fixed-size sketch (``mode="sketch"``, see `SampleMetric`). All states sync under
    DDP in one go: call ``compute()`` on every rank; it is never cached (``compute_with_cache=False``), so every
    call syncs whatever each rank did since the last. ``persistent=True`` puts the states in ``state_dict()``
    (``torch.save`` / ``load_state_dict`` round-trip, also with ``weights_only`` loading). ``backend`` picks the
    decoder (`decode_batch`: the compiled CPU kernel for CPU tensors by default, else torch ops).

    Generation pairs the k-th generated event with the k-th true one (``pairing="index"``), or matches them
    within ``tolerance_ms`` on the unwrapped time axis (``pairing="time"``, see `owa_metrics.decode.matching`;
    ``update(..., origin_ns=)`` gives each row's origin, by default its first valid target event): the pairs feed
    every metric, and the detection matches add ``detect/{category}/precision|recall|f1``, the micro
    ``detect/precision|recall|f1``, ``detect/time_error_abs_p50_ms`` and ``count/invalid_pred_events``.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = None

    def __init__(self, tokenizer=None, *, vocab: Optional[VocabMap] = None, config: Optional[CodecConfig] = None,
                 format: Optional[str] = None, alignment: Alignment = "teacher_forcing", mode: Mode = "exact", relative_accuracy: float = 0.005,
                 sketch_range: tuple[float, float] = (1e-4, 1e8), num_resamples: int = 1000, seed: int = 42,
                 persistent: bool = False, backend: Backend = "auto", pairing: Pairing = "index",
                 tolerance_ms: float = 100.0, **kwargs):
        kwargs.setdefault("compute_with_cache", False)  # every compute() syncs, on every rank: no stale rank
        super().__init__(**kwargs)
        vocab = _vocab_map(vocab if vocab is not None else tokenizer, config, format)
        if alignment not in ("teacher_forcing", "generation"):
            raise ValueError(f"alignment must be 'teacher_forcing' or 'generation', got {alignment!r}")
        if mode not in ("exact", "sketch"):
            raise ValueError(f"mode must be 'exact' or 'sketch', got {mode!r}")
        if backend not in ("auto", "kernel", "torch"):
            raise ValueError(f"backend must be 'auto' (the CPU kernel for CPU tensors, else torch ops), 'kernel' or "
                             f"'torch', got {backend!r}")
        check_pairing(pairing, alignment)
        tolerance_ns(tolerance_ms, vocab.config.timestamp_window_ns)  # raises saying what is allowed
        self.pairing, self.tolerance_ms = pairing, tolerance_ms
        self.vocab, self.alignment, self.mode, self.backend = vocab, alignment, mode, backend
        self.spec = check_statistics(relative_accuracy, sketch_range, num_resamples, seed)
        self.num_resamples, self.seed = num_resamples, seed
        self.window_ns = vocab.config.timestamp_window_ns
        columns = vocab.config.token_format.digit_columns
        self.n_ts, self.n_delta = columns.count("timestamp"), columns.count("dx")
        self._field_table = field_table(vocab.config).numpy()

        def sums(name, *shape):
            self.add_state(name, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

        sums("confusion", N_CAT, N_CAT + 1)  # target category x predicted category + invalid
        sums("statuses", len(Status))
        sums("target_statuses", len(Status))  # each target event's own decode status
        sums("event_counts", len(EVENT_COUNTS))
        sums("timestamp_digits", len(GROUPS), self.n_ts + 1)  # digit-prefix matches, then the number of events
        sums("mouse_digits", 3, self.n_delta + 1)  # dx, dy, both
        sums("keyboard", 6)  # vk right, action right, both right, events, sum of sequence accuracies, sequences
        sums("mouse_action", 4)  # flags right, events with flags, scroll right, events with scroll
        sums("movement", 6)  # residual, sum gx, sum gy, sum gx², sum gy², events
        sums("token_fields", 2, len(TOKEN_FIELDS))  # right, total
        sums("token_loss", 2, N_CAT + 1)  # summed loss, events; then skipped tokens, 0
        if mode == "exact":  # flat float64 rows of TIMESTAMP_COLUMNS / MOUSE_COLUMNS (NaN: not defined)
            self.add_state("timestamp_samples", default=[], dist_reduce_fx="cat")
            self.add_state("mouse_samples", default=[], dist_reduce_fx="cat")
            self._dtype = torch.float64  # an empty list state syncs as an empty tensor of this dtype
        else:
            sums("timestamp_sketch", 2, len(GROUPS), self.spec.size)  # signed error, percent error
            sums("mouse_sketch", len(MOUSE_COLUMNS), self.spec.size)
        if pairing == "time":
            sums("detection", 3, N_CAT + 1)  # TP, FP, FN per category; last column: invalid generated events
            if mode == "exact":
                self.add_state("detection_samples", default=[], dist_reduce_fx="cat")  # |a_p - a_t| ms
            else:
                sums("detection_sketch", self.spec.size)
        self.persistent(persistent)

    # ------------------------------------------------------------------------------------------ update
    def update(self, preds: Union[torch.Tensor, EventBatch], target: Optional[torch.Tensor] = None,
               logits: Optional[torch.Tensor] = None, origin_ns: Union[None, int, torch.Tensor] = None,
               token_loss: Optional[torch.Tensor] = None) -> None:
        if origin_ns is not None and self.pairing != "time":
            raise ValueError("origin_ns is the time origin of pairing='time': build OWAEventMetrics(..., "
                             "alignment='generation', pairing='time') to use it")
        tokens = None  # teacher forcing on token ids: `event_token_stats`
        if isinstance(preds, EventBatch):
            batch = preds
            if target is not None or logits is not None or token_loss is not None:
                raise ValueError("update(EventBatch) takes the decoded batch alone: the token accuracy and loss need "
                                 "the token ids, so pass update(preds_ids, target_ids, logits=...) instead")
            if (batch.time_matching is not None) != (self.pairing == "time"):
                raise ValueError(f"this EventBatch was paired by {'time' if batch.time_matching else 'index'} but "
                                 f"the metric pairs by {self.pairing}: decode with decode_batch(..., "
                                 f"pairing='{self.pairing}') or build the metric with the batch's pairing")
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
            if logits is not None and logits.dim() == 2:
                logits = logits[None]
            if token_loss is not None:
                token_loss = torch.nn.functional.pad(token_loss.reshape(target.shape[0], -1).to(target.device),
                                                     (0, target.shape[1] - token_loss.shape[-1]))  # [B, 0]: one column
            if self.pairing == "index" and self._compiled(target):
                self._update_compiled(preds, target, logits, token_loss)
                return
            batch = decode_batch(preds, target, self.vocab, self.alignment, self.backend, self.pairing,
                                 self.tolerance_ms, origin_ns)
            if self.alignment == "teacher_forcing":
                tokens = event_token_stats(batch, preds, target, self.vocab.config, logits, token_loss)
        self._accumulate(batch, tokens)
        if batch.time_matching is not None:
            self._update_detection(batch.time_matching)

    def _accumulate(self, batch: EventBatch, tokens: Optional[EventTokenStats]) -> None:
        """Every additive state and the samples of a decoded batch, all rows at once (the torch path).

        Each row's contributions (one-hot statuses and categories from a lookup by key, prefix matches, movement
        terms) form a matrix X [N, C], each row's groups (all, comparable, comparable per category, valid per
        category, comparable mouse, valid) a matrix G [N, 12]: one product G^T X holds every count (integers: exact
        in float64 whatever the order). The rows' integers V = (p - t values, t values, p values, p - t digits,
        status, target status, predicted kind) give the key (`_Plan.key_columns`) and are compared to 0 once: the
        prefix matches (digit prefixes, keyboard fields, button flags and scroll with their presence) are the columns
        of ``(V != 0) @ plan.prefixes`` equal to ``plan.prefix_targets``. The movement terms and the samples
        (`_sample_columns`) read the float64 columns ``plan.number_columns`` of V. The per-sequence means and the
        token sums (as `token_sums`) are added to it, and `_Plan.take` scatters the lot into the states with one
        ``_foreach_add_`` (with the sketch counts in sketch mode). Exact mode reads the numbers of comparable and of
        mouse rows in one host sync, from their packed count in G^T X (`_append_samples`).
        """
        with_loss = tokens is not None and tokens.loss_sum is not None
        plan = _Plan.get(self, batch.pred.values.device, tokens is not None, with_loss, batch.time_matching is not None)
        t, p = batch.target, batch.pred
        statuses = torch.stack([batch.status, t.status, p.kind], 1)
        values = torch.cat([p.values - t.values, t.values, p.values, p.digits - t.digits, statuses], 1)  # V [N, 27 + D]
        key = torch.addcmul(plan.key_offsets, values.index_select(1, plan.key_columns), plan.key_weights).sum(1)
        onehots, groups, per_seq_terms, sampled = plan.rows.index_select(0, key).split(plan.row_sizes, 1)
        # [N, P]: 1, 1, 1, keyboard right, then X's columns
        prefixes = ((values != 0).float() @ plan.prefixes) == plan.prefix_targets
        numbers = values.index_select(1, plan.number_columns).double()  # exact: |values| < 2^53
        moves = numbers[:, 2:6]  # error x, true x, error y, true y
        squares = moves * moves
        norms_squared = squares.view(-1, 2, 2).sum(1)  # |error|², |true|²
        x = torch.cat([onehots, prefixes, moves, squares, norms_squared], 1)
        sums = groups.T @ x  # x is float64: the lookup's columns are
        # per sequence: (valid, comparable keyboard events) and (comparable, those right) -> over the first two: the
        # sequences with any (x / x) and the means of the ratios (0 for a sequence without events)
        per_seq = torch.zeros((batch.num_sequences, 4), dtype=torch.float64, device=key.device).index_add_(
            0, batch.seq_idx, per_seq_terms * prefixes[:, :4])
        seen_means = (per_seq / per_seq[:, :2].clamp(min=1).repeat(1, 2)).sum(0)
        gap = batch.pred_count - batch.target_count
        # sequences, count matches, predicted events, extra and missing events (the clamp only cuts gap and -gap)
        per_batch = torch.stack([gap == gap, gap == 0, batch.pred_count, gap, -gap]).clamp(min=0).sum(1)
        extra = [per_batch, seen_means]  # `sources` casts per_batch to float64 (exact: small integers)
        if batch.time_matching is not None:  # the generated events paired with nothing, the detection counts
            extra += [batch.time_matching.extra_events.reshape(1), batch.time_matching.detection_counts.reshape(-1)]
        if tokens is not None:  # as `token_sums`: the field counts, and with logits the token loss by category (its
            # events are G^T X's valid per category; then the skipped tokens and a 0)
            extra += [tokens.field_correct, tokens.field_total]
            if with_loss:
                loss = torch.zeros(N_CAT + 1, dtype=torch.float64, device=key.device).index_add_(
                    0, tokens.category, tokens.loss_sum)  # in row order, as the kernel's
                extra += [loss, tokens.loss_skipped.reshape(1), plan.zero]
        flat = plan.sources(sums, extra)
        states, increments = plan.states, plan.take(flat)
        samples = self._sample_columns(numbers, moves, norms_squared)
        if self.mode == "sketch":  # the sketch counts go with the other increments
            states = [*states, "timestamp_sketch", "mouse_sketch"]
            increments += self._sketch_increments(samples.index_select(1, plan.sketch_columns),
                                                  plan.sketch_rows.index_select(0, key))
        torch._foreach_add_(self._flat_states(states), increments)
        if self.mode == "exact":
            self._append_samples(samples, sampled, flat[plan.SAMPLED])

    def _flat_states(self, names: list[str]) -> list[torch.Tensor]:
        """Flat views of the named states, kept while the states are the same tensors (`reset` and syncs replace
        them): the additions of `_accumulate` go through them without a view op per state and update."""
        views = self.__dict__.setdefault("_flat_views", {})
        out = []
        for name in names:
            state = getattr(self, name)
            if name not in views or views[name][0] is not state:
                views[name] = (state, state.view(-1))
            out.append(views[name][1])
        return out

    def _sample_columns(self, numbers: torch.Tensor, moves: torch.Tensor, norms_squared: torch.Tensor) -> torch.Tensor:
        """[N, TIMESTAMP_COLUMNS + MOUSE_COLUMNS] of every row (the definitions of `timestamp_errors`,
        `euclidean_percent_error`, `signed_percent_error` and `direction_error_deg`, four ratios in one), from the
        rows' float64 ``numbers`` (`_Plan.NUMBERS`), ``moves`` (error x, true x, error y, true y) and their
        |error|², |true|²."""
        half = self.window_ns // 2
        timestamp_error, true_timestamp, _, true_x, _, true_y, pred_x, pred_y, category = numbers.unbind(1)
        # signed error, true timestamp: ms (the wrap in float64 is exact: fmod is, and the numbers are integers)
        ms = torch.stack([torch.remainder(timestamp_error + half, self.window_ns) - half, true_timestamp], 1) / 1e6
        # numerators (|signed ms|, euclidean error, error x, error y) over denominators (|true ms|, |g|, g x, g y)
        numerators, denominators = torch.cat([ms.abs(), norms_squared.sqrt(), moves], 1).view(
            -1, 4, 2).unbind(2)
        defined = denominators != 0  # a zero ground truth: NaN
        percent = torch.where(defined, numerators / denominators * 100, float("nan"))
        # each row's two angles side by side (as the kernel's): a vectorized atan2 treats both alike, so equal
        # directions give exactly 0
        angle_p, angle_g = torch.atan2(torch.stack([pred_y, true_y], 1), torch.stack([pred_x, true_x], 1)).unbind(1)
        delta = (angle_p - angle_g).abs()
        direction = torch.where(defined[:, 1], torch.minimum(delta, 2 * math.pi - delta) * (180 / math.pi), float("nan"))
        timestamp_pct, euclidean, x_pct, y_pct = percent.unbind(1)
        return torch.stack([ms[:, 0], timestamp_pct, category, euclidean, x_pct, y_pct, direction], 1)

    def _append_samples(self, samples: torch.Tensor, sampled: torch.Tensor, packed_count: torch.Tensor) -> None:
        """The comparable rows' timestamp columns and the comparable mouse rows' mouse columns (``sampled`` [N, 2]:
        1 where comparable, where comparable mouse) into the exact states. Their numbers are data: read in one host
        sync from ``packed_count`` = comparable rows x 2^26 + comparable mouse rows (`_Plan.SAMPLE_SHIFT`; exact in
        float64 below 2^26 rows each, far more than a batch holds), then sync-free selections."""
        if len(samples) >= _Plan.SAMPLE_SHIFT:  # the packed count would no longer be exact
            raise ValueError(f"{len(samples)} target events in one update: exact mode reads at most "
                             f"{_Plan.SAMPLE_SHIFT - 1} per update; split the batch")
        n_timestamp, n_mouse = divmod(int(packed_count), _Plan.SAMPLE_SHIFT)
        rows = torch.nonzero_static(sampled.T, size=n_timestamp + n_mouse)[:, 1]  # the comparable, then the mouse
        timestamp_rows, mouse_rows = rows.split([n_timestamp, n_mouse])
        timestamps, mouse = samples.split([len(TIMESTAMP_COLUMNS), len(MOUSE_COLUMNS)], 1)
        append_samples(self.timestamp_samples, timestamps.index_select(0, timestamp_rows).view(-1))
        append_samples(self.mouse_samples, mouse.index_select(0, mouse_rows).view(-1))

    def _update_detection(self, found: TimeMatching) -> None:
        """The detection errors into their samples (the counts go with `_accumulate`'s)."""
        if self.mode == "exact":
            append_samples(self.detection_samples, found.detection_error_ms.to(self.device))
        else:
            self.detection_sketch += sketch_counts(found.detection_error_ms.to(self.device), self.spec)

    def _compiled(self, target: torch.Tensor) -> bool:
        """Whether this update runs the compiled CPU kernel (decode and accumulate in numba, see `backend`)."""
        if self.backend == "torch" or self.device.type != "cpu":
            return False
        return self.backend == "kernel" or (target.device.type == "cpu" and decode_kernel.available())

    def _update_compiled(self, preds: torch.Tensor, target: torch.Tensor, logits: Optional[torch.Tensor],
                         token_loss: Optional[torch.Tensor] = None) -> None:
        """The same states as the torch ops, from two compiled loops: `kernel.decode_arrays` over the tokens, then
        `functional.kernel.accumulate` over the events (and `token_stats` under teacher forcing)."""
        out = kernel_arrays(preds, target, self.vocab, self.alignment, _Tables.get(self.vocab.config, target.device))
        seq, t, p = out["seq"], out["target"], out["pred"]
        n = seq.shape[0]
        ts_rows, mouse_rows, angle_args = np.empty((n, 3)), np.empty((n, 4)), np.empty((2, 2 * n))
        m_ts, m_mouse = fused.accumulate(
            seq, out["status"], t["status"], t["kind"], t["values"], t["digits"], p["kind"], p["values"], p["digits"],
            out["target_count"], out["pred_count"], self.n_ts, self.n_delta, self.window_ns, fused.KIND_CATEGORY,
            self.confusion.numpy(), self.statuses.numpy(), self.target_statuses.numpy(), self.event_counts.numpy(),
            self.timestamp_digits.numpy(), self.mouse_digits.numpy(), self.keyboard.numpy(), self.mouse_action.numpy(),
            self.movement.numpy(), ts_rows, mouse_rows, angle_args)
        if self.alignment == "teacher_forcing":
            with_loss = logits is not None or token_loss is not None
            token_loss, skipped = (token_losses(logits, target) if logits is not None else
                                   given_token_losses(token_loss, target) if token_loss is not None else (torch.zeros(1), 0))
            fused.token_stats(seq, t["status"], t["kind"], t["values"], t["start"], t["end"], t["start_cut"],
                              target.shape[1], target.numpy().reshape(-1), preds.numpy().reshape(-1),
                              self._field_table, token_loss.numpy(), with_loss, self.token_fields.numpy(),
                              self.token_loss.numpy())
            self.token_loss[0, -1] += skipped
        mouse_rows = mouse_rows[:m_mouse]
        mouse_rows[:, 3] = fused.direction_deg(angle_args, m_mouse)
        timestamps, mouse = torch.from_numpy(ts_rows[:m_ts]), torch.from_numpy(mouse_rows)
        if self.mode == "exact":
            append_samples(self.timestamp_samples, timestamps.reshape(-1))
            append_samples(self.mouse_samples, mouse.reshape(-1))
        else:
            self._add_sketches(timestamps, mouse)

    def _sketch_increments(self, values: torch.Tensor, sketch_rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The flat increments of ``timestamp_sketch`` and ``mouse_sketch`` (as `_add_sketches`) from the rows of
        `_sample_columns`, all at once: each row's ``values`` [N, 8] (signed error, signed error, percent error,
        percent error, mouse columns: `_Plan.sketch_columns`) into its ``sketch_rows`` [N, 8] (`_Plan.sketch_rows`:
        those of its category, or a last, dropped row where the row is not comparable, or for the mouse columns not a
        comparable mouse row)."""
        n_rows = 2 * len(GROUPS) + len(MOUSE_COLUMNS)
        counts = sketch_counts(values, self.spec, sketch_rows, n_rows + 1).view(-1)
        return counts.split([self.timestamp_sketch.numel(), self.mouse_sketch.numel(), self.spec.size])[:2]

    def _add_sketches(self, timestamps: torch.Tensor, mouse: torch.Tensor) -> None:
        """Rows (signed error ms, percent error, category) and rows of `MOUSE_COLUMNS` (NaN: left out) into the
        sketch states in one count: rows (quantity, group) with group 0 = all and 1 + c = category c, then the
        mouse columns."""
        n_groups = len(GROUPS)
        base, step, mouse_rows = _sketch_rows(n_groups, timestamps.device)
        category = timestamps[:, 2:].nan_to_num().long()
        group = torch.cat([(base + category * step).reshape(-1), mouse_rows.expand(len(mouse), -1).reshape(-1)])
        twice = timestamps[:, :2, None].expand(-1, 2, 2)  # each row's (signed, signed, percent, percent)
        counts = sketch_counts(torch.cat([twice.reshape(-1), mouse.reshape(-1)]), self.spec,
                               group, 2 * n_groups + len(MOUSE_COLUMNS))
        self.timestamp_sketch += counts[:2 * n_groups].view(2, n_groups, -1)
        self.mouse_sketch += counts[2 * n_groups:]

    # ----------------------------------------------------------------------------------------- compute
    def _wrap_compute(self, compute):
        """torchmetrics' compute (sync, then compute), without its "called before update" warning: a rank or an
        epoch without batches is fine (counts are 0, the other keys left out)."""
        wrapped = super()._wrap_compute(compute)

        @functools.wraps(wrapped)
        def quiet(*args, **kwargs):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
                return wrapped(*args, **kwargs)

        return quiet

    def compute(self) -> dict[str, torch.Tensor]:
        out = event_type_report(self.confusion, self.statuses, self.event_counts)
        out["status/invalid_target_rate"] = self._warn_invalid_targets()
        if self.alignment == "teacher_forcing":
            out.update(token_report(self.token_fields, self.token_loss))
        timestamp = self._timestamp_distributions()
        for g, group in enumerate(GROUPS):
            prefix = "timestamp" if group == "all" else f"{group}/timestamp"
            signed, percent = timestamp[g]
            low, high = signed.iqm_ci(self.num_resamples, self.seed)
            out[f"{prefix}/abs_error_p95_ms"] = signed.abs().quantile(0.95)
            out[f"{prefix}/signed_error_iqm_ms"] = signed.iqm()
            out[f"{prefix}/signed_error_ci_low_ms"], out[f"{prefix}/signed_error_ci_high_ms"] = low, high
            out[f"{prefix}/iqmpe_pct"] = percent.iqm()
            out.update(_levels(f"{prefix}/precision", self.timestamp_digits[g]))
        out.update({f"keyboard/{k}": v for k, v in keyboard_report(self.keyboard).items()})
        out.update({f"mouse/{k}": v for k, v in mouse_action_report(self.mouse_action).items()})
        euclidean, signed_x, signed_y, direction = self._mouse_distributions()
        out["mouse/euclidean_pe_p95_pct"] = euclidean.quantile(0.95)
        out["mouse/euclidean_iqmpe_pct"] = euclidean.iqm()
        for axis, dist in (("x", signed_x), ("y", signed_y)):
            low, high = dist.iqm_ci(self.num_resamples, self.seed)
            out[f"mouse/signed_pe_{axis}_iqm_pct"] = dist.iqm()
            out[f"mouse/signed_pe_{axis}_ci_low_pct"], out[f"mouse/signed_pe_{axis}_ci_high_pct"] = low, high
            out[f"mouse/d{axis}_iqmpe_pct"] = dist.abs().iqm()
        out["mouse/direction_error_p50_deg"], out["mouse/direction_error_p95_deg"] = direction.quantile([0.5, 0.95])
        for i, name in enumerate(("dx", "dy", "euclidean")):
            out.update(_levels(f"mouse/{name}_precision", self.mouse_digits[i]))
        out["mouse/r2"] = movement_r2_report(self.movement)
        if self.pairing == "time":
            out.update(detection_report(self.detection))
            out["count/invalid_pred_events"] = self.detection[1, N_CAT]
            errors = (Distribution(counts=self.detection_sketch, spec=self.spec) if self.mode == "sketch"
                      else Distribution.exact(cat_samples(self.detection_samples, self.device)))
            out["detect/time_error_abs_p50_ms"] = errors.quantile(0.5)
        skip = GENERATION_ONLY if self.alignment == "teacher_forcing" else ()
        return {k: torch.as_tensor(v, dtype=torch.float64).to(self.device) for k, v in out.items()
                if k not in skip and not bool(torch.isnan(torch.as_tensor(v)))}

    def _warn_invalid_targets(self, threshold: float = 0.05) -> torch.Tensor:
        """invalid targets / target events (0 without events); above ``threshold`` one warning on rank zero
        naming the most frequent decode failure and the likely fix."""
        rate = self.statuses[int(Status.INVALID_TARGET)] / self.event_counts[0].clamp(min=1)
        if float(rate) > threshold:
            failures = self.target_statuses.clone()
            failures[int(Status.VALID)] = 0
            reason = Status(int(failures.argmax())).label
            rank_zero_warn(InvalidTargetsWarning(float(rate), reason, (
                f"{float(rate):.0%} of the target events do not decode (most often: {reason}); they are left out of "
                f"every rate. This metric reads the {self.vocab.describe()}: if the labels are in the other format, "
                "pass format='hierarchical' | 'factorized'; if screens use other image tokens, pass a CodecConfig with "
                "your image_prefix / image_token / image_suffix (or let the tokenizer's be detected by not passing "
                "config). status/invalid_target_rate logs this rate.")))
        return rate

    def extra_repr(self) -> str:
        pairing = f", pairing={self.pairing}, tolerance_ms={self.tolerance_ms}" if self.pairing == "time" else ""
        return f"{self.vocab.describe()}, alignment={self.alignment}{pairing}, mode={self.mode}"

    def _timestamp_distributions(self) -> list[tuple[Distribution, Distribution]]:
        """(signed error, percent error) of each of GROUPS; exact mode: one sort per quantity for all groups."""
        if self.mode == "sketch":
            return [(Distribution(counts=self.timestamp_sketch[0, g], spec=self.spec),
                     Distribution(counts=self.timestamp_sketch[1, g], spec=self.spec)) for g in range(len(GROUPS))]
        rows = _rows(self.timestamp_samples, len(TIMESTAMP_COLUMNS), self.device)
        category, defined = rows[:, 2].to(torch.uint8), ~torch.isnan(rows[:, 1])
        signed = distinct_by_group(rows[:, 0], category, N_CAT)
        percent = distinct_by_group(rows[defined, 1], category[defined], N_CAT)
        return [(Distribution(*s), Distribution(*p)) for s, p in zip(signed, percent)]

    def _mouse_distributions(self) -> list[Distribution]:
        if self.mode == "sketch":
            return [Distribution(counts=self.mouse_sketch[i], spec=self.spec) for i in range(len(MOUSE_COLUMNS))]
        rows = _rows(self.mouse_samples, len(MOUSE_COLUMNS), self.device)
        return [Distribution.exact(_finite(rows[:, i])) for i in range(len(MOUSE_COLUMNS))]

    def error_histograms(self, bins: int = 50) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{name: (counts, edges)}`` of the signed timestamp error (ms), the mouse signed percent errors and
        the direction error (deg) over all ranks (call on every rank). The range shows the bulk: P2..P98 of the
        values, narrowed to Tukey's fences (Q1 - 1.5 IQR, Q3 + 1.5 IQR); values outside it count in the edge bins."""
        with self.sync_context():
            signed, _ = self._timestamp_distributions()[0]
            _, signed_x, signed_y, direction = self._mouse_distributions()
            named = {"timestamp/signed_error_ms": signed, "mouse/signed_pe_x_pct": signed_x,
                     "mouse/signed_pe_y_pct": signed_y, "mouse/direction_error_deg": direction}
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

    def confusion_matrix(self) -> torch.Tensor:
        """Category confusion counts over all ranks (call on every rank): rows are the target categories
        (keyboard, mouse_op, mouse_nop, screen), columns the predicted ones and a last ``invalid`` column."""
        with self.sync_context():
            return self.confusion.clone()


@functools.lru_cache(maxsize=None)
def _sketch_rows(n_groups: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sketch rows of `_add_sketches`: (signed, all), (signed, category), (percent, all), (percent, category) as
    base + category x step; then the mouse columns'. Cached by device: a copy to a GPU would wait for it."""
    return (torch.tensor([0, 1, n_groups, n_groups + 1], device=device), torch.tensor([0, 1, 0, 1], device=device),
            torch.arange(2 * n_groups, 2 * n_groups + len(MOUSE_COLUMNS), device=device))


class _Plan:
    """The lookups of `OWAEventMetrics._accumulate` and where each state's increments are in its sources, for one
    format, device and kind of update (token stats, token loss, time pairing).

    ``rows`` [key, C0 + 12 + 4 + 2]: by key = (((status x S + target status) x 5 + predicted category) x 4 +
    predicted kind + 1) x 5 + target category (``key_weights`` . V's ``key_columns`` + ``key_offsets``' sum), the one-hot
    status, target status and predicted category (an undecoded type mismatch in its type token's column, as
    `event_type_sums`), 1 and the packed sample count (comparable x 2^26 + comparable mouse; C0 columns: X's
    first), then the row's groups (G), its per-sequence terms (valid, comparable keyboard, comparable, comparable
    keyboard) and its sampled columns (comparable, comparable mouse). ``sketch_rows`` [key, 8]: the sketch rows of
    its eight sketched values (`_sketch_rows`; not sampled: the last, dropped row). ``prefixes`` [27 + D, P]: which
    entries of V != 0 (V: p - t values, t values, p values, p - t digits, status, target status, predicted kind) each
    prefix column of X counts (-1: a presence, counted as absence), and ``prefix_targets`` their sums when all
    match. ``number_columns``: the columns of V read as numbers (`NUMBERS`). The sources: the counts [12, C]
    (groups x columns of X), then the extras of `_accumulate` in their order (``zero``: a 0 among them).
    """

    _cache: dict = {}
    ALL, COMPARABLE, COMPARABLE_CATEGORY, VALID_CATEGORY, MOUSE, VALID = 0, 1, 2, 6, 10, 11
    KEYBOARD = COMPARABLE_CATEGORY + int(Category.KEYBOARD)
    NUMBERS = ("timestamp error", "true timestamp", "error x", "true x", "error y", "true y", "pred x", "pred y",
               "category")
    SAMPLE_SHIFT = 1 << 26  # the packed sample count: comparable rows x SAMPLE_SHIFT + comparable mouse rows

    def __init__(self, n_ts: int, n_delta: int, device, tokens: bool, loss: bool, time: bool):
        n_status = len(Status)
        one = 2 * n_status + N_CAT + 1
        shape = (n_status, n_status, N_CAT + 1, KIND_CODES, N_CAT + 1)
        status, t_status, p_category, kind, category = np.indices(shape).reshape(5, -1)
        undecoded_mismatch = (status == int(Status.TYPE_MISMATCH)) & (p_category == int(Category.INVALID))
        column = np.where(undecoded_mismatch, fused.KIND_CATEGORY[np.maximum(kind - 1, 0)], p_category)
        comparable, valid, in_range = status == int(Status.VALID), t_status == int(Status.VALID), category < N_CAT
        mouse = comparable & ((category == int(Category.MOUSE_OP)) | (category == int(Category.MOUSE_NOP)))
        keyboard = comparable & (category == int(Category.KEYBOARD))
        rows = np.zeros((status.size, one + 2 + 12 + 4 + 2))
        at, g, clamped = np.arange(status.size), one + 2, np.minimum(category, N_CAT - 1)
        for offset, columns, value in [
                (0, status, 1), (n_status, t_status, 1), (2 * n_status, column, 1), (one, 0, 1),
                (one + 1, 0, comparable * self.SAMPLE_SHIFT + mouse), (g + self.ALL, 0, 1),
                (g + self.COMPARABLE, 0, comparable), (g + self.MOUSE, 0, mouse),
                (g + self.COMPARABLE_CATEGORY, clamped, comparable & in_range),
                (g + self.VALID_CATEGORY, clamped, valid & in_range), (g + self.VALID, 0, valid),
                (g + 12, 0, valid), (g + 13, 0, keyboard), (g + 14, 0, comparable), (g + 15, 0, keyboard),
                (g + 16, 0, comparable), (g + 17, 0, mouse)]:
            rows[at, offset + columns] = value
        self.rows = torch.from_numpy(rows).to(device)
        self.row_sizes = [one + 2, 12, 4, 2]
        k = KIND_CODES
        weights = [n_status * (N_CAT + 1) * k * (N_CAT + 1), (N_CAT + 1) * k * (N_CAT + 1), k * (N_CAT + 1), N_CAT + 1, 1]
        self.key_weights = torch.tensor(weights, device=device)
        self.key_offsets = torch.tensor([0, 0, 0, N_CAT + 1, 0], device=device)  # kind -1: row 0
        n_groups = len(GROUPS)
        base, step, mouse_rows = (r.numpy() for r in _sketch_rows(n_groups, "cpu"))
        dropped = 2 * n_groups + len(MOUSE_COLUMNS)
        sketch = np.concatenate([base + clamped[:, None] * step, np.broadcast_to(mouse_rows, (status.size, 4))], 1)
        sketch[~comparable, :4], sketch[~mouse, 4:] = dropped, dropped
        self.sketch_rows = torch.from_numpy(sketch).to(device)
        self.sketch_columns = torch.tensor([0, 0, 1, 1, 3, 4, 5, 6], device=device)  # of `_sample_columns`
        # V's columns: p - t values, t values, p values, p - t digits, status, target status, predicted kind
        width, n_digits = len(VALUE_COLUMNS), n_ts + 2 * n_delta
        error, true, pred = ((lambda c, k=k: k * width + VALUE_COLUMNS.index(c)) for k in range(3))
        status_column = 3 * width + n_digits
        self.key_columns = torch.tensor([status_column, status_column + 1, pred("category"), status_column + 2,
                                         true("category")], device=device)
        columns = {"timestamp error": error("timestamp_ns"), "true timestamp": true("timestamp_ns"),
                   "error x": error("dx"), "true x": true("dx"), "error y": error("dy"), "true y": true("dy"),
                   "pred x": pred("dx"), "pred y": pred("dy"), "category": true("category")}
        self.number_columns = torch.tensor([columns[name] for name in self.NUMBERS], device=device)
        # prefix columns: the (entry of V != 0, weight) each counts: the mismatches of values and digits (1), and
        # the presence of button_flags and button_data (-1: counted as their absence, 1 - present)
        digit = lambda j: (3 * width + j, 1)  # noqa: E731
        dx, dy = (lambda j: digit(n_ts + j)), (lambda j: digit(n_ts + n_delta + j))  # noqa: E731
        vk, action, flags, scroll = ((error(c), 1) for c in ("vk", "action", "button_flags", "button_data"))
        has_flags, has_scroll = (true("button_flags"), -1), (true("button_data"), -1)
        counted = [[], [], [], [vk, action]]  # 1 (the per-sequence terms' weights), then keyboard right
        counted += [[digit(i) for i in range(j + 1)] for j in range(n_ts)]
        counted += [[vk], [action], [flags, has_flags], [has_flags], [scroll, has_scroll], [has_scroll]]
        counted += [[dx(i) for i in range(j + 1)] for j in range(n_delta)]
        counted += [[dy(i) for i in range(j + 1)] for j in range(n_delta)]
        counted += [[f(i) for f in (dx, dy) for i in range(j + 1)] for j in range(n_delta)]
        prefixes = np.zeros((status_column + 3, len(counted)))
        for j, entries in enumerate(counted):
            for row, weight in entries:
                prefixes[row, j] = weight
        # float32: small integers, exact (half the bytes of float64); the targets: their sums when all match
        self.prefixes = torch.from_numpy(prefixes).to(device, torch.float32)
        self.prefix_targets = torch.from_numpy(np.minimum(prefixes, 0).sum(0)).to(device, torch.float32)
        ts = one + 2 + 4
        kb, both = ts + n_ts, one + 2 + 3
        action, digits = kb + 2, kb + 6
        movement = digits + 3 * n_delta  # X's last: moves (e x, g x, e y, g y), their squares, |e|², |g|²
        width = movement + 10

        def cell(group, *columns):
            return [group * width + c for c in columns]

        sources = iter(range(12 * width, 12 * width + 64))  # the extras, in the order `_accumulate` lists them
        take = lambda k: [next(sources) for _ in range(k)]  # noqa: E731
        per_batch, seen, means = take(5), take(2), take(2)  # sequences, count match, pred events, extra, missing
        extra_events, missing = per_batch[3], per_batch[4]
        if time:  # the generated events paired with nothing, and the target events left unpaired
            extra_events, missing = take(1)[0], cell(self.ALL, int(Status.MISSING))[0]
        self.SAMPLED = cell(self.ALL, one + 1)[0]
        residual, true_x, true_y, squares = movement + 8, movement + 1, movement + 3, movement + 4
        plan = {
            "confusion": [i for c in range(N_CAT)
                          for i in cell(self.VALID_CATEGORY + c, *range(2 * n_status, 2 * n_status + N_CAT + 1))],
            "statuses": cell(self.ALL, *range(n_status)),
            "target_statuses": cell(self.ALL, *range(n_status, 2 * n_status)),
            "event_counts": cell(self.ALL, one) + per_batch[:3] + [extra_events, missing, means[0], seen[0]],
            "timestamp_digits": [i for g in range(1 + N_CAT) for i in cell(self.COMPARABLE + g, *range(ts, kb), one)],
            "keyboard": cell(self.KEYBOARD, kb, kb + 1, both, one) + [means[1], seen[1]],
            "mouse_action": cell(self.MOUSE, *range(action, action + 4)),
            "movement": cell(self.MOUSE, residual, true_x, true_y, squares + 1, squares + 3, one),
            "mouse_digits": [i for a in range(3)
                             for i in cell(self.MOUSE, *range(digits + a * n_delta, digits + (a + 1) * n_delta), one)],
        }
        if time:
            plan["detection"] = take(3 * (N_CAT + 1))
        if tokens:
            plan["token_fields"] = take(2 * len(TOKEN_FIELDS))
            if loss:  # summed loss per category, skipped tokens; events per category, 0
                by_category, skipped, zero = take(N_CAT + 1), take(1), take(1)
                events = [cell(self.VALID_CATEGORY + c, one)[0] for c in range(N_CAT)]
                plan["token_loss"] = by_category[:N_CAT] + skipped + events + zero
        self.states = list(plan)
        self.index = torch.tensor([i for cells in plan.values() for i in cells], device=device)
        self.zero = torch.zeros(1, dtype=torch.float64, device=device)  # the token loss state's 0
        self.sizes = [len(cells) for cells in plan.values()]

    @classmethod
    def get(cls, metric: "OWAEventMetrics", device, tokens: bool, loss: bool, time: bool) -> "_Plan":
        key = (metric.n_ts, metric.n_delta, torch.device(device), tokens, loss, time)
        if key not in cls._cache:
            cls._cache[key] = cls(*key)
        return cls._cache[key]

    @staticmethod
    def sources(sums: torch.Tensor, extra: list[torch.Tensor]) -> torch.Tensor:
        """The counts ``sums`` and the ``extra`` sources, flat (float64)."""
        return torch.cat([sums.reshape(-1), *extra])

    def take(self, sources: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each state's increments, flat, from the `sources`."""
        return sources.index_select(0, self.index).split(self.sizes)


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


def _rows(state, width: int, device) -> torch.Tensor:
    return cat_samples(state, device).reshape(-1, width)


def _finite(values: torch.Tensor) -> torch.Tensor:
    return values[~torch.isnan(values)]


def _levels(prefix: str, sums: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{prefix}_p1`` ... from `digit_precision_sums` (matches per level, then the number of samples)."""
    return {f"{prefix}_p{j + 1}": ratio(v, sums[-1]) for j, v in enumerate(sums[:-1])}
