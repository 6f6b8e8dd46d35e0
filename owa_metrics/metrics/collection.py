"""`OWAEventMetrics`: the whole report — decode once per batch, every metric in one pass, one flat dict out. The class
reads as its states, its update and its compute; beside it: `arguments` (its checks), `accumulation` (how a batch adds
to the states), `shared_compute` (`Read`, the ranks sharing the report) and `plotting` (``plot()``, the histograms and
the confusion counts)."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Literal, Optional, Sequence, Union

import numpy as np
import torch
from torchmetrics.utilities import rank_zero_warn

from ..decode import kernel as decode_kernel
from ..decode.batch import _check_inputs, _Tables, decode_batch, kernel_arrays
from ..decode.event_batch import Alignment, Backend, EventBatch, Pairing
from ..decode.screens import without_screen_events
from ..functional.declare import Given, GivenSamples, Samples, Shape
from ..functional.plan import Plan
from ..functional.report import REPORT, WORDS, default_tag_keys, higher_is_better
from ..functional.tokens import event_token_stats, field_table
from ..tokens.codec import CodecConfig
from ..tokens.vocab import VocabMap
from . import plotting
from .accumulation import accumulate_arrays, accumulate_batch
from .arguments import (MAX_TAGS, check_alignment, check_d2e, check_event_batch, check_origin, check_tag_keys,
                        check_tags, check_token_inputs, is_tag_name, tag_ids, vocab_map)
from .base import Float64Metric, Mode, check_statistics
from .shared_compute import InvalidTargetsWarning, Named, Read, deal, definition_keys, warn_invalid_targets

__all__ = ["MAX_TAGS", "InvalidTargetsWarning", "KeyDirections", "Named", "OWAEventMetrics", "Read", "deal",
           "is_tag_name"]

GeneratedScreens = Literal["context", "scored"]


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
    call syncs whatever each rank did since the last, and the ranks share the report's work (`definition_keys`;
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

    # ------------------------------------------------------------------------------------------ states
    def __init__(self, tokenizer=None, *, vocab: Optional[VocabMap] = None, config: Optional[CodecConfig] = None,
                 format: Optional[str] = None, alignment: Alignment = "teacher_forcing", mode: Mode = "exact",
                 relative_accuracy: float = 0.005, sketch_range: tuple[float, float] = (1e-4, 1e8),
                 num_resamples: int = 1000, seed: int = 42, persistent: bool = False, backend: Backend = "auto",
                 pairing: Pairing = "index", tolerance_ms: Union[None, float, tuple[float, ...]] = None,
                 tags: Optional[Sequence[str]] = None, tag_keys: Union[None, str, Sequence[str]] = None,
                 bin_ms: Union[None, float, Literal["auto"]] = "auto", empty_bins_as_correct: bool = False,
                 bin_shifts: Sequence[int] = (), generated_screens: GeneratedScreens = "context", **kwargs):
        kwargs.setdefault("compute_with_cache", False)  # every compute() syncs, on every rank: no stale rank
        super().__init__(**kwargs)
        self._syncs_here = False  # set by compute() while it syncs (`_wrap_compute`): the ranks share the report
        vocab = vocab_map(vocab if vocab is not None else tokenizer, config, format)
        self._tolerance_ns, sweep, self.tolerance_ms = check_alignment(
            alignment, mode, backend, pairing, tolerance_ms, generated_screens, vocab.config.timestamp_window_ns)
        self.pairing, self.generated_screens = pairing, generated_screens
        self.tags, self.tag_keys = check_tags(tags), check_tag_keys(tag_keys)
        self._groups = len(self.tags) or 1  # the groups of sequences the states are kept by: one per tag, or one
        self._tag_key_set = set(default_tag_keys(alignment) if tag_keys is None else
                                () if tag_keys == "all" else tag_keys)
        self.vocab, self.alignment, self.mode, self.backend = vocab, alignment, mode, backend
        self.spec = check_statistics(relative_accuracy, sketch_range, num_resamples, seed)
        self.num_resamples, self.seed = num_resamples, seed
        self.window_ns = vocab.config.timestamp_window_ns
        columns = vocab.config.token_format.digit_columns
        self.shape = Shape(columns.count("timestamp"), columns.count("dx"), self.window_ns, sweep,
                           *check_d2e(bin_ms, empty_bins_as_correct, bin_shifts, alignment))
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
        check_origin(origin_ns, self.pairing)
        if isinstance(preds, EventBatch):
            check_event_batch(preds, (target, logits, token_loss), tags, bool(self.tags), self.pairing,
                              self._tolerance_ns, self.tolerance_ms)
            accumulate_batch(self, preds, None)
            return
        check_token_inputs(target, logits, token_loss, self.alignment)
        preds, target = _check_inputs(preds, target, self.alignment)  # [B, T] int64
        preds, target = self.scored_ids(preds, target)
        if logits is not None and logits.dim() == 2:
            logits = logits[None]
        if token_loss is not None:
            token_loss = torch.nn.functional.pad(token_loss.reshape(target.shape[0], -1).to(target.device),
                                                 (0, target.shape[1] - token_loss.shape[-1]))  # [B, 0]: one column
        group = tag_ids(tags, self.tags, target.shape[0], target.device)  # each sequence's tag, or None
        if self._compiled(target):  # decode and accumulate once: each row into its sequence's tag
            out = kernel_arrays(preds, target, self.vocab, self.alignment, _Tables.get(self.vocab.config, target.device))
            accumulate_arrays(self, out, preds, target, logits, token_loss, group)
            return
        batch = decode_batch(preds, target, self.vocab, self.alignment, self.backend, self.pairing,
                             self.tolerance_ms, origin_ns)
        tokens = None  # teacher forcing: `event_token_stats`
        if self.alignment == "teacher_forcing":
            tokens = event_token_stats(batch, preds, target, self.vocab.config, logits, token_loss, group, self._groups)
        accumulate_batch(self, batch, tokens, group)

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

    def _compiled(self, target: torch.Tensor) -> bool:
        """Whether this update runs the compiled CPU kernels (screens as context, decode, accumulate, token statistics)."""
        if self.backend == "torch" or self.device.type != "cpu" or self.pairing == "time":
            return False
        return self.backend == "kernel" or (target.device.type == "cpu" and decode_kernel.available())

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
        keys = definition_keys(self, reads)  # the ranks share the work
        out = keys[None]
        warn_invalid_targets(self, out["status/invalid_target_rate"])
        if self.tag_keys not in (None, "all") and set(self.tag_keys) - out.keys():
            rank_zero_warn(f"tag_keys names {sorted(set(self.tag_keys) - out.keys())}, which this report does not "
                           "hold (a misspelt key, or no samples for it yet): see docs/METRICS.md for the keys")
        for tag in list(reads)[1:]:  # a tag's keys: `default_tag_keys` (tag_keys=None), all, or those named
            out.update({f"tag/{self.tags[tag]}/{k}": v for k, v in keys[tag].items()
                        if self.tag_keys == "all" or k in self._tag_key_set})
        out = {k: torch.as_tensor(v, dtype=torch.float64).to(self.device) for k, v in out.items()
               if not bool(torch.isnan(torch.as_tensor(v)))}
        return out

    # ------------------------------------------------------------------------------------------ what it shows
    def plot(self, val=None, ax=None, keys: Optional[Sequence[str]] = None):
        """The headline keys (or ``keys``) of ``val`` (else ``compute()``; several: a line over steps), a panel each
        with torchmetrics' plotting (`plotting.plot`). Returns ``(figure, axes)``."""
        return plotting.plot(self, val, ax, keys)

    def error_histograms(self, bins: int = 50) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{name: (counts, edges)}`` of the error distributions over all ranks (`plotting.error_histograms`)."""
        return plotting.error_histograms(self, bins)

    def confusion_matrix(self, sync: bool = True) -> torch.Tensor:
        """Category confusion counts over all ranks, or this process's (``sync=False``): targets x predicted + invalid
        (`plotting.confusion_matrix`)."""
        return plotting.confusion_matrix(self, sync)

    def extra_repr(self) -> str:
        pairing = f", pairing={self.pairing}, tolerance_ms={self.tolerance_ms}" if self.pairing == "time" else ""
        screens = f", generated_screens={self.generated_screens}" if self.alignment == "generation" else ""
        return f"{self.vocab.describe()}, alignment={self.alignment}{pairing}{screens}, mode={self.mode}"


class KeyDirections(dict):
    """`OWAEventMetrics.higher_is_better`, per key as torchmetrics allows for collections: True where a higher value
    is better, False where a lower one is, None where neither (a count, a share, a signed error): the named keys
    (`WORDS`) listed, any key answered by its name (`owa_metrics.functional.report.BETTER`)."""

    def __missing__(self, key: str):
        return higher_is_better(key)


OWAEventMetrics.higher_is_better = KeyDirections({key: higher_is_better(key) for key in WORDS})
