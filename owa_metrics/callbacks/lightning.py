"""`OWAEventMetricsCallback`: event metrics of every validation (and test) epoch, logged through the module's
``log``; what else it writes is in `artifacts`, how it generates in `generation`."""

from __future__ import annotations

import os
import tempfile
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import BatchSampler, DistributedSampler

from ..decode.batch import decode_batch
from ..decode.event_batch import Pairing
from ..metrics.base import Mode
from ..metrics.collection import OWAEventMetrics
from ..functional.report import headline_keys
from ..report import format_report, sample_note, sample_rows, sample_table, unit_of
from ..figures import batch_timelines, draw_latency_curve, draw_timeline, png_of
from .artifacts import (breakdown_name, headline_layout, log_breakdowns, log_extras, log_images, report_json,
                        save_reports)
from .generation import OUTPUT_FORMS, GenerateOutput, check_batch, generate_batch

NEEDS = ("validation_step must return a dict with 'logits' (or 'preds': argmax token ids) and 'labels', or an HF "
         "ModelOutput with logits while the batch holds 'labels' (or 'input_ids'); -100 marks ignored labels; "
         "optionally 'token_loss': the per-token cross-entropy, [:, t] the loss of label t + 1 ([B, T - 1] or [B, T])")


def _discard(path: Path, pid: int) -> None:
    """Remove ``path`` in process ``pid`` only (a forked rank inherits the finalizer, not the file's reading)."""
    if os.getpid() == pid:
        path.unlink(missing_ok=True)


@dataclass
class _Run:
    """One dataloader's metric in the running epoch, and the sequences it keeps for the sample table."""

    metric: OWAEventMetrics
    kept: list = field(default_factory=list)  # (preds, target) CPU ids of the first sequences
    tags: list = field(default_factory=list)  # their tag names (None: no tags)
    origins: list = field(default_factory=list)  # their time origins (pairing="time"; -1: the first true event)
    generated: int = 0  # sequences this rank generated from


class OWAEventMetricsCallback(Callback):
    """Decode predicted (teacher forcing) or generated sequences every validation and test epoch and log the
    report of `OWAEventMetrics` under ``prefix`` (test: ``test_prefix``, by default ``prefix`` with ``val`` read
    as ``test``): the headline keys (`headline_keys`, about ten) through ``pl_module.log_dict`` as ``{prefix}{key}``
    (``trainer.callback_metrics``, checkpoint monitors, the progress bar, any logger); every other key on rank zero
    straight to each logger's ``log_metrics`` in a few groups (`artifacts.breakdown_name`:
    ``val.owa.timestamp/keyboard/timestamp/precision_p1``), a count only once it is not zero. So what Lightning
    carries between processes stays small whatever the keys (``ddp_spawn`` sends ``callback_metrics`` through a
    pipe). ``callback.reported`` holds the last epoch's every key on every rank, named as ``{prefix}{key}``, and in
    the process that launched spawned ranks (``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``) once they are done: their
    local rank zero leaves it in a file of the temporary directory (`tempfile.gettempdir`), which ``reported`` reads
    back once and removes (unread, it goes with the callback or at exit), as Lightning returns ``callback_metrics``
    and the weights. With
    several dataloaders each has its own metric and its names end in ``/dataloader_idx_{i}``, as Lightning's.

    Teacher forcing (default): logits or argmax ids from what ``validation_step`` returns, labels from there or
    the batch; HF convention (logits at t predict label t + 1), so both are shifted; argmax runs on the model's
    device and nothing of the logits outlives the batch. Generation: every ``every_n_batches``-th batch, up to
    ``max_sequences`` sequences per epoch and dataloader, counted over all ranks (each rank generates from its
    share, ``max_sequences / world_size``, so that a DDP run scores what one process scores when the ranks' batches
    split the validation set evenly); the sequence minus its last ``predict_events`` actions (events, with
    ``generated_screens="scored"``) is the prompt, cut from the left at an event to fit ``context_tokens -
    max_new_tokens`` (the context: ``context_tokens``, else the model's config, ``n_positions`` /
    ``max_position_embeddings`` of its text config, for the default generation; ``max_new_tokens`` by default
    ``80 predict_events``, at most half the context); greedy ``generate`` (or ``generate_fn``, whose rows
    ``generate_output`` reads: see `generation.new_ids`) continues it, and the generated events are paired with the
    true ones by index, or with ``pairing="time"`` matched within ``tolerance_ms`` (default 100; with another pairing
    it has no effect and is refused) on the time axis unwrapped from the prompt's last event
    (`generation.last_event_ns`), both on their actions: screens are what the model is shown
    (``generated_screens="scored"``, passed to `OWAEventMetrics`, scores them too). Under DDP the rows by which a
    `DistributedSampler` pads the ranks are dropped (`real_rows`), so each sequence counts once; with a sampler
    whose padding cannot be told, that is warned once.

    Every rank computes (the metric syncs); then rank zero adds, each switchable: histograms of the errors, the
    category confusion matrix as a figure, a sample table (TensorBoard, W&B: up to 24 events of the epoch's first
    ``samples`` sequences, every category present among them shown), and the report files
    ``owa_metrics/{prefix}/epoch_{E}_step_{S}[_dataloader_{i}].json`` / ``.md`` in each logger's run (`artifacts`:
    TensorBoard / CSV log dir, W&B run files, MLflow artifacts) and in ``artifacts_dir`` when given; without a
    logger nothing is written unless ``artifacts_dir``. Nothing is logged during the sanity check unless
    ``log_sanity_check``. ``format=`` / ``config=`` (and every other keyword) go to `OWAEventMetrics`; the format
    and image tokens in use are the first line the callback logs. Two instances (e.g. teacher forcing and
    generation) need different prefixes; a checkpoint keeps each one's settings apart (``state_key``), and a
    resumed run keeps the constructor's settings (a difference from the checkpoint's is said once).

    Figures (rank zero, `owa_metrics.figures`): the timelines of the epoch's first ``timeline_sequences`` sequences
    (default 2: the sample table's first, so that epochs compare; 0: none) and, with ``bin_shifts``, the D2E latency
    curve, as TensorBoard and W&B images ``{prefix}timeline_{i}`` / ``{prefix}latency_curve`` and PNG files beside the
    ``.md`` report (MLflow: artifacts). TensorBoard's Custom Scalars tab gets a layout of the headline keys.

    Slices: with ``tags=[names]`` (and ``tag_keys=``, both `OWAEventMetrics`'), each sequence's tag is
    ``tag_fn(batch)`` or ``batch["tag"]`` (ids into ``tags``, or names; a batch without one is an error); the
    per-tag keys are logged in one group (``val.owa.tags/tag/minecraft/comparable_rate``), and the per-tag table
    is the TensorBoard text ``{prefix}tags`` and a section of the ``.md`` report.
    """

    SETTINGS = ("alignment", "pairing", "tolerance_ms", "mode", "prefix", "test_prefix", "log_loss", "every_n_batches",
                "max_sequences", "predict_events", "max_new_tokens", "context_tokens", "generate_output", "histograms",
                "confusion_figure", "samples", "timeline_sequences", "artifacts", "artifacts_dir", "log_sanity_check")

    def __init__(self, tokenizer, *, alignment: Literal["teacher_forcing", "generation"] = "teacher_forcing",
                 pairing: Pairing = "index", tolerance_ms: Union[None, float, tuple] = None, mode: Mode = "exact",
                 prefix: str = "val/owa/", test_prefix: Optional[str] = None, log_loss: bool = True,
                 every_n_batches: int = 1, max_sequences: int = 32, predict_events: int = 4,
                 max_new_tokens: Optional[int] = None, generate_fn: Optional[Callable] = None,
                 generate_output: GenerateOutput = "auto", context_tokens: Optional[int] = None,
                 histograms: bool = True, confusion_figure: bool = True, samples: int = 8,
                 timeline_sequences: int = 2, artifacts: bool = True, artifacts_dir: Optional[str] = None,
                 log_sanity_check: bool = False, tag_fn: Optional[Callable] = None, **metric_kwargs: Any):
        self.tokenizer, self.generate_fn, self.metric_kwargs = tokenizer, generate_fn, metric_kwargs
        self.tag_fn = tag_fn
        self.alignment, self.mode, self.prefix, self.log_loss = alignment, mode, prefix, log_loss
        self.test_prefix = test_prefix or "test/" + (prefix[len("val/"):] if prefix.startswith("val/") else prefix)
        self.pairing, self.tolerance_ms = pairing, tolerance_ms
        self.every_n_batches, self.max_sequences, self.predict_events = every_n_batches, max_sequences, predict_events
        self.max_new_tokens, self.histograms, self.confusion_figure = max_new_tokens, histograms, confusion_figure
        self.generate_output, self.context_tokens = generate_output, context_tokens
        self.samples, self.artifacts, self.log_sanity_check = samples, artifacts, log_sanity_check
        if isinstance(timeline_sequences, bool) or not isinstance(timeline_sequences, int) or timeline_sequences < 0:
            raise ValueError(f"timeline_sequences is how many sequences' timelines to draw each epoch (0: none), got "
                             f"{timeline_sequences!r}")
        self.timeline_sequences = timeline_sequences
        self.artifacts_dir = None if artifacts_dir is None else str(artifacts_dir)
        self._metrics = [self._new_metric()]  # one per dataloader, kept across epochs (reset at each start)
        self._runs: dict[int, _Run] = {}
        self._said_padding = False  # the warning that a sampler's padding cannot be told apart: once
        self._charted: set[str] = set()  # breakdown charts logged so far (rank zero)
        self._laid_out: set[str] = set()  # the prefixes whose Custom Scalars layout is written (rank zero)
        self._reported: dict[str, torch.Tensor] = {}  # the last epoch's reports, every key (`_report`)
        # a spawned rank is a copy of this object in another process: its local rank zero hands `reported` over here
        self._launcher_pid = os.getpid()
        self._handoff = Path(tempfile.gettempdir()) / f"owa_metrics_reported_{os.getpid()}_{uuid.uuid4().hex}.pt"
        weakref.finalize(self, _discard, self._handoff, self._launcher_pid)  # unread: removed with this object
        if generate_output not in OUTPUT_FORMS or (generate_output == "new" and generate_fn is None):
            raise ValueError(f"generate_output={generate_output!r}: it says how generate_fn's rows read, one of "
                             f"{', '.join(map(repr, OUTPUT_FORMS))}; 'new' needs a generate_fn (the default generation "
                             "returns HF generate's rows, each prompt followed by its new ids)")
        if context_tokens is not None and not (isinstance(context_tokens, int) and context_tokens > 0):
            raise ValueError(f"context_tokens={context_tokens!r}: give the model's context in tokens (a positive "
                             "integer), or None to read it from the model's config")
        if tag_fn is not None and not self.metric.tags:
            raise ValueError("tag_fn gives each sequence's tag: name the tags too, OWAEventMetricsCallback(..., "
                             "tags=['minecraft', 'vscode', ...], tag_fn=...)")

    @property
    def reported(self) -> dict[str, torch.Tensor]:
        """The last epoch's every key, ``{prefix}{key}`` (in a launching process: what its spawned ranks left)."""
        if os.getpid() == self._launcher_pid and self._handoff.exists():
            self._reported = torch.load(self._handoff, weights_only=True)
            self._handoff.unlink()
        return self._reported

    @property
    def metric(self) -> OWAEventMetrics:
        """The first dataloader's metric."""
        return self._metrics[0]

    @property
    def state_key(self) -> str:
        return self._generate_state_key(alignment=self.alignment, prefix=self.prefix)

    def _new_metric(self) -> OWAEventMetrics:
        return OWAEventMetrics(self.tokenizer, alignment=self.alignment, mode=self.mode, pairing=self.pairing,
                               tolerance_ms=self.tolerance_ms, **self.metric_kwargs)

    # ------------------------------------------------------------------------------------------- hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for other in trainer.callbacks:
            if isinstance(other, OWAEventMetricsCallback) and other is not self and (
                    other.prefix == self.prefix or other.test_prefix == self.test_prefix):
                raise ValueError(f"two OWAEventMetricsCallback log under prefix {self.prefix!r} / test_prefix "
                                 f"{self.test_prefix!r}: give each its own prefix= (e.g. prefix='val/owa_gen/' for "
                                 "the generation one)")
        pairing = f", pairing=time (tolerance {self.metric.tolerance_ms} ms)" if self.pairing == "time" else ""
        rank_zero_info(f"OWAEventMetricsCallback: {self.metric.vocab.describe()}; alignment={self.alignment}"
                       f"{pairing}, mode={self.mode}")

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._runs, self._reported = {}, {}

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._runs, self._reported = {}, {}

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking and not self.log_sanity_check:
            if self.alignment == "generation":  # a batch generation cannot read fails before training starts
                check_batch(batch, pl_module, self.metric.vocab, self.predict_events, self.generate_fn,
                            self.metric.generated_screens == "context", self.max_new_tokens, self.context_tokens)
            else:  # and so does a wrong validation_step
                _find(outputs, batch)
            self._tags(batch)
            return
        self._update(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._update(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking and not self.log_sanity_check:
            return
        batches = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        self._report(trainer, pl_module, self.prefix, len(batches))

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer, pl_module, self.test_prefix, len(trainer.num_test_batches))

    # ----------------------------------------------------------------------------------------- helpers
    def _run(self, dataloader_idx: int, device: torch.device) -> _Run:
        if dataloader_idx not in self._runs:
            while len(self._metrics) <= dataloader_idx:
                self._metrics.append(self._new_metric())
            metric = self._metrics[dataloader_idx] = self._metrics[dataloader_idx].to(device)
            metric.reset()
            self._runs[dataloader_idx] = _Run(metric)
        return self._runs[dataloader_idx]

    def _update(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int,
                dataloader_idx: int) -> None:
        run = self._run(dataloader_idx, pl_module.device)
        real = self._real_rows(trainer, batch_idx, dataloader_idx)
        if self.alignment == "generation":
            self._generate(trainer, pl_module, run, batch, batch_idx, real)
            return
        logits, preds, labels, token_loss = _find(outputs, batch)
        tags = self._tags(batch)
        if real is not None and real < labels.shape[0]:  # the rest of the batch repeats other ranks' sequences
            logits, preds, labels, token_loss, tags = (x if x is None else x[:real]
                                                       for x in (logits, preds, labels, token_loss, tags))
            if not real:
                return
        with torch.no_grad():
            if preds is None:
                preds = logits.argmax(-1)
            preds, target = preds[:, :-1], labels[:, 1:]
            loss = {}
            if self.log_loss and token_loss is not None:  # token_loss[:, t]: label t + 1's, as logits[:, t]
                loss = {"token_loss": token_loss[:, :target.shape[1]]}
            elif self.log_loss and logits is not None:
                loss = {"logits": logits[:, :-1]}
            run.metric.update(preds, target, **loss, tags=tags)
            self._keep(run, preds, target, tags=tags)

    def _generate(self, trainer: Trainer, pl_module: LightningModule, run: _Run, batch: Any, batch_idx: int,
                  real: Optional[int] = None) -> None:
        world, rank = trainer.world_size, trainer.global_rank
        share = self.max_sequences // world + (rank < self.max_sequences % world)  # this rank's part of the epoch's
        rows = share - run.generated if real is None else min(share - run.generated, real)
        if batch_idx % self.every_n_batches or rows <= 0:
            return
        generated, target, origin = generate_batch(
            pl_module, batch, batch_idx, self.tokenizer, run.metric.vocab, self.generate_fn,
            rows=rows, predict_events=self.predict_events,
            max_new_tokens=self.max_new_tokens, time_origin=self.pairing == "time",
            actions_only=run.metric.generated_screens == "context", context_tokens=self.context_tokens,
            generate_output=self.generate_output)
        run.generated += target.shape[0]
        tags = self._tags(batch)
        run.metric.update(generated, target, origin_ns=origin, tags=None if tags is None else tags[:target.shape[0]])
        self._keep(run, generated, target, origin, tags)

    def _real_rows(self, trainer: Trainer, batch_idx: int, dataloader_idx: int) -> Optional[int]:
        """How many first rows of this batch are sequences of this rank's share under DDP (`real_rows`: the rest pad
        the ranks to equal length, repeating other ranks' sequences); None: every row (one process, or a sampler
        whose padding cannot be told, which is said once)."""
        if trainer.world_size == 1:
            return None
        loaders = trainer.test_dataloaders if trainer.testing else trainer.val_dataloaders
        loaders = list(loaders.values()) if isinstance(loaders, Mapping) else loaders
        loader = loaders[dataloader_idx] if isinstance(loaders, (list, tuple)) else loaders
        rows = real_rows(loader, batch_idx)
        if rows is None and not self._said_padding:
            self._said_padding = True
            rank_zero_warn(padding_warning(loader, trainer.world_size))
        return rows

    def _tags(self, batch: Any):
        """Each sequence's tag (``tag_fn(batch)``, else ``batch["tag"]``); None when the metric has no tags."""
        if not self.metric.tags:
            return None
        tags = self.tag_fn(batch) if self.tag_fn else batch.get("tag") if isinstance(batch, Mapping) else None
        if tags is None:
            raise RuntimeError(f"OWAEventMetricsCallback(tags={list(self.metric.tags)}) reads each sequence's tag from "
                               "batch['tag'] (ids into tags, or names) or tag_fn(batch); this batch has neither")
        return tags

    def _keep(self, run: _Run, preds: torch.Tensor, target: torch.Tensor,
              origin_ns: Optional[torch.Tensor] = None, tags=None) -> None:
        keep = max(self.samples, self.timeline_sequences)  # the sample table's and the timelines' sequences
        for b in range(min(keep - len(run.kept), preds.shape[0])):
            run.kept.append((preds[b].detach().cpu(), target[b].detach().cpu()))
            run.origins.append(-1 if origin_ns is None else int(origin_ns[b]))
            tag = None if tags is None else tags[b]
            run.tags.append(tag if tag is None or isinstance(tag, str) else run.metric.tags[int(tag)])

    def _report(self, trainer: Trainer, pl_module: LightningModule, prefix: str, dataloaders: int) -> None:
        """Every rank: each dataloader's report (the metric syncs); the headline keys through ``pl_module.log_dict``
        (a bounded number: `headline_keys`); then rank zero writes the breakdowns to the loggers and the rest."""
        step = _scalar_step(trainer)
        headline = headline_keys(self.alignment)
        charts = {}
        for idx in range(max(dataloaders, 1)):
            run = self._run(idx, pl_module.device)  # also on a rank without batches of this dataloader: it syncs
            suffix = f"/dataloader_idx_{idx}" if dataloaders > 1 else ""
            report = run.metric.compute()
            self._reported.update({f"{prefix}{key}{suffix}": value for key, value in report.items()})
            pl_module.log_dict({f"{prefix}{key}{suffix}": report[key].float() for key in headline if key in report},
                               on_step=False, on_epoch=True, sync_dist=False,
                               add_dataloader_idx=False)  # already reduced over ranks
            histograms = run.metric.error_histograms() if self.histograms else {}
            confusion = run.metric.confusion_matrix() if self.confusion_figure else None
            if trainer.is_global_zero:
                self._write(trainer, run, prefix, suffix, idx, {k: float(v) for k, v in report.items()}, histograms,
                            confusion, step)
            charts.update({f"{prefix}{key}{suffix}": key for key in headline if key in report})
            run.metric.reset()
        if trainer.is_global_zero and prefix not in self._laid_out:  # once a run: the headline's charts, first
            self._laid_out.add(prefix)
            headline_layout(trainer.loggers, prefix, charts)
        if os.getpid() != self._launcher_pid and trainer.local_rank == 0:  # a spawned rank: hand `reported` over
            written = self._handoff.with_suffix(f".{os.getpid()}")
            torch.save({k: v.cpu() for k, v in self._reported.items()}, written)
            os.replace(written, self._handoff)  # whole or not at all

    def _write(self, trainer: Trainer, run: _Run, prefix: str, suffix: str, idx: int, report: dict,
               histograms: dict, confusion, step: int) -> None:
        """Rank zero: the breakdown scalars, the extras to the loggers and the report files (no collective in here)."""
        headline = headline_keys(self.alignment)
        scalars = {}
        for key, value in report.items():  # a count that has been zero all along is no chart yet (the files have it)
            name = breakdown_name(key, prefix) + suffix
            if key not in headline and (value != 0 or unit_of(key) != "count" or name in self._charted):
                scalars[name] = value
                self._charted.add(name)
        log_breakdowns(trainer.loggers, scalars, step)
        epoch = trainer.current_epoch
        where = f", dataloader {idx}" if suffix else ""
        decoded = self._decode_kept(run)
        rows = [] if decoded is None else sample_rows(decoded[0], *decoded[1:], run.metric.vocab,
                                                      sequences=range(min(self.samples, len(run.kept))))
        samples = f"{sample_table(rows)}\n\n{sample_note(run.metric.vocab.config)}" if rows else None
        log_extras(trainer.loggers, prefix, suffix, histograms, confusion, samples, rows, step,
                   f"category confusion, epoch {epoch}{where}", report)
        images = self._figures(run, decoded, report, f"epoch {epoch}{where}")
        log_images(trainer.loggers, prefix, suffix, images, step)
        if self.artifacts:
            name = str(Path(*_folder(prefix), f"epoch_{epoch}_step_{step}" + (f"_dataloader_{idx}" if suffix else "")))
            context = {"epoch": epoch, "step": step, **({"dataloader_idx": idx} if suffix else {})}
            title = f"OWA event metrics ({prefix}), epoch {epoch}, step {step}{where}"
            save_reports(trainer.loggers, self.artifacts_dir, {
                f"{name}.json": report_json(report, **context),
                f"{name}.md": format_report(report, title, samples, self.alignment),
                **{f"{name}_{figure}.png": png for figure, png in images.items()}})

    def _decode_kept(self, run: _Run):
        """``(batch, preds, target)`` of the kept sequences as the metric scored them (screens as context), or None."""
        if not run.kept:
            return None
        preds, target = run.metric.scored_ids(*_stack(run.kept))
        batch = decode_batch(preds, target, run.metric.vocab, self.alignment, pairing=self.pairing,
                             tolerance_ms=self.tolerance_ms,
                             origin_ns=torch.tensor(run.origins) if self.pairing == "time" else None)
        return batch, preds, target

    def _figures(self, run: _Run, decoded, report: dict, when: str) -> dict[str, bytes]:
        """The PNGs of the timelines of the first ``timeline_sequences`` kept sequences and, with shifts, of the
        latency curve, by name (``timeline_{i}``, ``latency_curve``); none when ``timeline_sequences=0``."""
        if not self.timeline_sequences:
            return {}
        shape = run.metric.shape
        images = {}
        if decoded is not None:
            shown = range(min(self.timeline_sequences, len(run.kept)))
            tags = run.tags if any(tag is not None for tag in run.tags) else None
            context = None
            if run.metric.alignment == "generation" and run.metric.generated_screens == "context":  # their screens
                target = _stack(run.kept[:len(shown)])[1]
                context = decode_batch(target, target, run.metric.vocab)
            for i, timeline in zip(shown, batch_timelines(decoded[0], shape.window_ns, shown, shape.bin_ms, tags,
                                                          [f"{when}, sequence {i}" for i in range(len(run.kept))],
                                                          context)):
                images[f"timeline_{i}"] = png_of(draw_timeline(timeline, width_in=8.0, dpi=90))
        if shape.bin_shifts:
            figure = draw_latency_curve(report, shape.bin_ms, f"D2E latency curve, {when}")
            if figure is not None:
                images["latency_curve"] = png_of(figure)
        return images

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The callback's settings (the metric states are reset every epoch: nothing else to keep)."""
        return {name: getattr(self, name) for name in self.SETTINGS}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores no setting: the constructor's win over a checkpoint's; a difference is said once."""
        self._say_changes(state_dict)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """A new prefix gives a new state key: compare with the checkpoint's one callback of this alignment."""
        states = checkpoint.get("callbacks", {})
        if self.state_key not in states:
            same = [state for key, state in states.items() if key.startswith(type(self).__qualname__ + "{")
                    and isinstance(state, Mapping) and state.get("alignment") == self.alignment]
            if len(same) == 1:
                self._say_changes(same[0])

    def _say_changes(self, saved: Mapping[str, Any]) -> None:
        changed = [f"{name}={getattr(self, name)!r} (checkpoint: {saved[name]!r})" for name in self.SETTINGS
                   if name in saved and saved[name] != getattr(self, name)]
        if changed:
            rank_zero_info(f"OWAEventMetricsCallback: resumed with settings other than the checkpoint's; using "
                           f"the new ones: {', '.join(changed)}")


def _find(outputs: Any, batch: Any):
    """``(logits, preds, labels, token_loss)`` from validation_step's output or the batch; raises saying what is
    needed."""
    logits = preds = labels = token_loss = None
    if isinstance(outputs, Mapping):
        logits, preds, labels = outputs.get("logits"), outputs.get("preds"), outputs.get("labels")
        token_loss = outputs.get("token_loss")
    elif outputs is not None and hasattr(outputs, "logits"):
        logits = outputs.logits
    if labels is None and isinstance(batch, Mapping):
        labels = batch.get("labels", batch.get("input_ids"))
    if labels is None or (logits is None and preds is None):
        got = "None" if outputs is None else type(outputs).__name__
        keys = f" with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else ""
        raise RuntimeError(f"OWAEventMetricsCallback cannot find predictions and labels (validation_step returned "
                           f"{got}{keys}): {NEEDS}")
    return logits, preds, labels, token_loss


def _stack(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(max(p.numel(), t.numel()) for p, t in pairs)
    pad = lambda x: torch.nn.functional.pad(x, (0, width - x.numel()), value=-100)  # noqa: E731
    return torch.stack([pad(p) for p, _ in pairs]), torch.stack([pad(t) for _, t in pairs])


_PADDING_SAMPLERS: tuple = (DistributedSampler,)  # the exact classes whose padding is told (and Lightning's below)
try:
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler, UnrepeatedDistributedSamplerWrapper

    _PADDING_SAMPLERS += (DistributedSamplerWrapper, UnrepeatedDistributedSampler, UnrepeatedDistributedSamplerWrapper)
except ImportError:  # another Lightning: its wrappers are warned about
    pass


def real_rows(loader: Any, batch_idx: int) -> Optional[int]:
    """How many first rows of batch ``batch_idx`` of ``loader`` are its rank's own samples, when it batches in order
    (a `BatchSampler`) from a `DistributedSampler` (torch's, or Lightning's wrappers of a sampler): that sampler
    gives rank r of W the positions r, r + W, r + 2W, ... of a list of N = ``len(sampler.dataset)`` samples padded
    to a multiple of W by repeating its first samples, so the rank's i-th sample is its own iff i W + r < N (and
    the batch's rows are samples ``batch_idx * batch_size`` on). None when it cannot be told (another sampler)."""
    batches = getattr(loader, "batch_sampler", None)
    sampler = getattr(batches, "sampler", None)
    if type(batches) is not BatchSampler or type(sampler) not in _PADDING_SAMPLERS:
        return None
    try:
        total = len(sampler.dataset)
    except TypeError:
        return None
    own = len(range(sampler.rank, total, sampler.num_replicas))  # the rank's samples i with i W + r < N
    return max(own - batch_idx * batches.batch_size, 0)


def padding_warning(loader: Any, world: int) -> str:
    """What the callback says once when `real_rows` cannot tell a sampler's padding: how many sequences may count
    twice, as many as a DistributedSampler's padding repeats: (-N) mod W, or up to W - 1 (N unknown)."""
    sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None) or getattr(loader, "sampler", None)
    name = type(sampler).__name__ if sampler is not None else f"the {type(loader).__name__}'s sampler"
    try:
        repeated = str(-len(loader.dataset) % world)
    except TypeError:
        repeated = f"up to {world - 1}"
    return (f"OWAEventMetricsCallback: cannot tell which validation sequences pad the {world} ranks to equal length "
            f"({name} is not a DistributedSampler, batched in order, over a dataset of known length): {repeated} "
            "sequences may be counted twice. Let Lightning add its DistributedSampler (use_distributed_sampler=True, "
            "the default), or give each rank a distinct share of the validation set.")


def _scalar_step(trainer: Trainer) -> int:
    """The step Lightning logs this validation epoch's scalars at (fit: the batches stepped so far, one less than
    ``global_step`` at the end of a training epoch; validate: 0), so that every artifact of the epoch shares it.
    Lightning's logger connector reads the private ``fit_loop.epoch_loop._batches_that_stepped``: no public
    attribute holds it (``global_step`` counts optimizer steps), so this reads the same, else ``global_step``."""
    return int(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step))


def _folder(prefix: str) -> list[str]:
    """The report files' folder under ``owa_metrics/``: the prefix's parts (``val/owa/`` -> ``val/owa``)."""
    return [*(part for part in prefix.split("/") if part not in ("", ".", ".."))]
