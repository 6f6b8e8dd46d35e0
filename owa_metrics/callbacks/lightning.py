"""`OWAEventMetricsCallback`: event metrics of every validation epoch, logged through the module's ``log``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from ..decode.batch import Pairing, decode_batch
from ..metrics.base import Mode
from ..metrics.collection import OWAEventMetrics
from ..report import SAMPLE_COLUMNS, format_report, sample_rows, sample_table
from .generation import check_batch, generate_batch

HISTOGRAM_RANGE = ("Range, per epoch: P2..P98 of the values, narrowed to Tukey's fences (Q1 - 1.5 IQR, Q3 + 1.5 "
                   "IQR); 50 bins; values outside the range are counted in the first and last bin.")
SAMPLES_DESCRIPTION = ("One row per target event of the first sequences: the true and the predicted event in words "
                       "(the raw tokens of one that does not decode) and a comparable pair's errors.")
NEEDS = ("validation_step must return a dict with 'logits' (or 'preds': argmax token ids) and 'labels', or an HF "
         "ModelOutput with logits while the batch holds 'labels' (or 'input_ids'); -100 marks ignored labels; "
         "optionally 'token_loss': the per-token cross-entropy, [:, t] the loss of label t + 1 ([B, T - 1] or [B, T])")


class OWAEventMetricsCallback(Callback):
    """Decode predicted (teacher forcing) or generated sequences every validation epoch and log the report of
    `OWAEventMetrics` under ``prefix`` through ``pl_module.log_dict`` (any Lightning logger).

    Teacher forcing (default): logits or argmax ids from what ``validation_step`` returns, labels from there or
    the batch; HF convention (logits at t predict label t + 1), so both are shifted; argmax runs on the model's
    device and nothing of the logits outlives the batch. Generation: every ``every_n_batches``-th batch, up to
    ``max_sequences`` sequences per epoch, the sequence minus its last ``predict_events`` events is the prompt;
    greedy ``generate`` (or ``generate_fn(input_ids, attention_mask, max_new_tokens)``, see `GENERATE_NEEDS`)
    continues it, and the generated events are paired with the true ones by index, or with ``pairing="time"``
    matched within ``tolerance_ms`` on the time axis unwrapped from the prompt's last event (`generation.last_event_ns`).

    Every rank computes (the metric syncs); rank zero adds, each switchable: histograms of the errors, the
    category confusion matrix as a figure, a sample table, and ``owa_metrics/epoch_{E}.json`` / ``.md`` in
    the log dir. Loggers without a feature are skipped (CSVLogger: scalars only). Nothing is logged during
    the sanity check unless ``log_sanity_check``. ``format=`` / ``config=`` (and every other keyword) go to
    `OWAEventMetrics`; the format and image tokens in use are the first line the callback logs.
    """

    SETTINGS = ("alignment", "pairing", "tolerance_ms", "mode", "prefix", "log_loss", "every_n_batches",
                "max_sequences", "predict_events", "max_new_tokens", "histograms", "confusion_figure", "samples",
                "artifacts", "log_sanity_check")

    def __init__(self, tokenizer, *, alignment: Literal["teacher_forcing", "generation"] = "teacher_forcing",
                 pairing: Pairing = "index", tolerance_ms: float = 100.0, mode: Mode = "exact",
                 prefix: str = "val/owa/", log_loss: bool = True,
                 every_n_batches: int = 1, max_sequences: int = 32, predict_events: int = 4,
                 max_new_tokens: Optional[int] = None, generate_fn: Optional[Callable] = None,
                 histograms: bool = True, confusion_figure: bool = True, samples: int = 2,
                 artifacts: bool = True, log_sanity_check: bool = False, **metric_kwargs: Any):
        self.tokenizer, self.generate_fn, self.metric_kwargs = tokenizer, generate_fn, metric_kwargs
        self.alignment, self.mode, self.prefix, self.log_loss = alignment, mode, prefix, log_loss
        self.pairing, self.tolerance_ms = pairing, tolerance_ms
        self.every_n_batches, self.max_sequences, self.predict_events = every_n_batches, max_sequences, predict_events
        self.max_new_tokens, self.histograms, self.confusion_figure = max_new_tokens, histograms, confusion_figure
        self.samples, self.artifacts, self.log_sanity_check = samples, artifacts, log_sanity_check
        self.metric = self._new_metric()
        self._kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # a few sequences for the sample table (CPU ids)
        self._origins: list[int] = []  # their time origins (pairing="time"; -1: the first true event)
        self._generated = 0

    def _new_metric(self) -> OWAEventMetrics:
        return OWAEventMetrics(self.tokenizer, alignment=self.alignment, mode=self.mode, pairing=self.pairing,
                               tolerance_ms=self.tolerance_ms, **self.metric_kwargs)

    # ------------------------------------------------------------------------------------------- hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        pairing = f", pairing=time (tolerance {self.tolerance_ms} ms)" if self.pairing == "time" else ""
        rank_zero_info(f"OWAEventMetricsCallback: {self.metric.vocab.describe()}; alignment={self.alignment}"
                       f"{pairing}, mode={self.mode}")

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.metric = self.metric.to(pl_module.device)
        self.metric.reset()
        self._kept, self._origins, self._generated = [], [], 0

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking and not self.log_sanity_check:
            _check_outputs(outputs, batch, self.alignment)  # a wrong validation_step fails before training starts
            return
        if self.alignment == "generation":
            self._generate(pl_module, batch, batch_idx)
            return
        logits, preds, labels, token_loss = _find(outputs, batch)
        with torch.no_grad():
            if preds is None:
                preds = logits.argmax(-1)
            preds, target = preds[:, :-1], labels[:, 1:]
            loss = {}
            if self.log_loss and token_loss is not None:  # token_loss[:, t]: label t + 1's, as logits[:, t]
                loss = {"token_loss": token_loss[:, :target.shape[1]]}
            elif self.log_loss and logits is not None:
                loss = {"logits": logits[:, :-1]}
            self.metric.update(preds, target, **loss)
            self._keep(preds, target)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking and not self.log_sanity_check:
            return
        report = self.metric.compute()  # every rank: the metric syncs its states
        pl_module.log_dict({self.prefix + k: v.float() for k, v in report.items()}, on_step=False, on_epoch=True,
                           sync_dist=False)  # already reduced over ranks
        histograms = self.metric.error_histograms() if self.histograms else {}
        confusion = self.metric.confusion_matrix() if self.confusion_figure else None
        self._rank_zero_extras(trainer, {k: float(v) for k, v in report.items()}, histograms, confusion)
        self.metric.reset()

    # ----------------------------------------------------------------------------------------- helpers
    def _keep(self, preds: torch.Tensor, target: torch.Tensor, origin_ns: Optional[torch.Tensor] = None) -> None:
        room = self.samples - len(self._kept)
        for b in range(min(room, preds.shape[0])):  # at most `samples` sequences per epoch
            self._kept.append((preds[b].detach().cpu(), target[b].detach().cpu()))
            self._origins.append(-1 if origin_ns is None else int(origin_ns[b]))

    def _generate(self, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx % self.every_n_batches or self._generated >= self.max_sequences:
            return
        generated, target, origin = generate_batch(
            pl_module, batch, batch_idx, self.tokenizer, self.metric.vocab, self.generate_fn,
            rows=self.max_sequences - self._generated, predict_events=self.predict_events,
            max_new_tokens=self.max_new_tokens, time_origin=self.pairing == "time")
        self._generated += target.shape[0]
        self.metric.update(generated, target, origin_ns=origin)
        self._keep(generated, target, origin)

    @rank_zero_only
    def _rank_zero_extras(self, trainer: Trainer, report: dict, histograms: dict, confusion) -> None:
        epoch, step = trainer.current_epoch, _scalar_step(trainer)
        rows = self._sample_rows()
        samples = sample_table(rows) if rows else None
        figure = _confusion_figure(confusion, epoch) if confusion is not None else None
        for logger in trainer.loggers:
            name = type(logger).__name__
            if name == "TensorBoardLogger":
                _tensorboard(logger.experiment, self.prefix, histograms, figure, samples, step)
            elif name == "WandbLogger":
                _wandb(logger.experiment, self.prefix, histograms, figure, rows, step)
        if figure is not None:
            import matplotlib.pyplot as plt

            plt.close(figure)
        if self.artifacts:
            folder = Path(trainer.log_dir or trainer.default_root_dir) / "owa_metrics"
            folder.mkdir(parents=True, exist_ok=True)
            _atomic_write(folder / f"epoch_{epoch}.json", json.dumps({"epoch": epoch, "step": step, **report}, indent=1))
            _atomic_write(folder / f"epoch_{epoch}.md", format_report(report, f"OWA event metrics, epoch {epoch}", samples,
                                                                      self.alignment))

    def _sample_rows(self) -> list[list[str]]:
        if not self._kept:
            return []
        preds, target = _stack(self._kept)
        batch = decode_batch(preds, target, self.metric.vocab, self.alignment, pairing=self.pairing,
                             tolerance_ms=self.tolerance_ms,
                             origin_ns=torch.tensor(self._origins) if self.pairing == "time" else None)
        return sample_rows(batch, preds, target, self.metric.vocab, sequences=range(len(self._kept)))

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The callback's settings, so that a resumed run logs the same way (metric states reset each epoch)."""
        return {name: getattr(self, name) for name in self.SETTINGS}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name in self.SETTINGS:
            if name in state_dict:
                setattr(self, name, state_dict[name])
        self.metric = self._new_metric()


def _check_outputs(outputs: Any, batch: Any, alignment: str) -> None:
    """Raise now, naming what is missing, if the callback could not read this batch."""
    if alignment == "generation":
        check_batch(batch)
    else:
        _find(outputs, batch)


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


def _scalar_step(trainer: Trainer) -> int:
    """The step Lightning logs this validation epoch's scalars at (fit: the batches stepped so far, one less than
    ``global_step`` at the end of a training epoch; validate: 0), so that every artifact of the epoch shares it."""
    return int(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step))


def _confusion_figure(confusion: torch.Tensor, epoch: int):
    """The target x predicted category matrix, coloured by the share of the target row, each cell's count and
    share written in black or white to contrast with it; sized to stay legible at 300 px wide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..events.event import CATEGORY_NAMES

    counts = confusion.cpu().double().numpy()
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(3.3, 2.4), dpi=100)  # TensorBoard fits images to ~200 px high, pixelated
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(CATEGORY_NAMES) + 1), [*CATEGORY_NAMES, "invalid"], fontsize=7, rotation=20,
                  ha="right", rotation_mode="anchor")
    ax.set_yticks(range(len(CATEGORY_NAMES)), CATEGORY_NAMES, fontsize=7)
    ax.tick_params(length=2, pad=1)
    ax.set_xlabel("predicted (colour: share of the target row)", fontsize=7, labelpad=2)
    ax.set_ylabel("target", fontsize=7, labelpad=1)
    ax.set_title(f"category confusion, epoch {epoch}", fontsize=8, fontweight="bold", pad=3)
    for (i, j), count in np.ndenumerate(counts):
        text = f"{count:,.0f}" if count < 10_000 else f"{count / 1000:,.0f}k"
        ax.text(j, i, f"{text}\n{share[i, j]:.0%}", ha="center", va="center", fontsize=7, linespacing=1.1,
                color="white" if share[i, j] > 0.5 else "black")
    fig.tight_layout(pad=0.3)
    return fig


def _histogram_summary(tag: str, counts: np.ndarray, edges: np.ndarray):
    """A TensorBoard histogram summary with its range described (what the tag's info says)."""
    from torch.utils.tensorboard.summary import histogram_raw

    centers = (edges[:-1] + edges[1:]) / 2
    summary = histogram_raw(tag, min=float(edges[0]), max=float(edges[-1]), num=float(counts.sum()),
                            sum=float((counts * centers).sum()), sum_squares=float((counts * centers ** 2).sum()),
                            bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist())
    summary.value[0].metadata.summary_description = HISTOGRAM_RANGE
    return summary


def _tensorboard(writer, prefix: str, histograms: dict, figure, samples: Optional[str], step: int) -> None:
    from torch.utils.tensorboard.summary import text

    for name, (counts, edges) in histograms.items():
        writer._get_file_writer().add_summary(_histogram_summary(f"{prefix}{name}", counts, edges), step)
    if figure is not None:
        writer.add_figure(f"{prefix}category_confusion", figure, global_step=step, close=False)
    if samples:
        summary = text(f"{prefix}samples", samples)
        summary.value[0].tag = f"{prefix}samples"  # the tag as named, as W&B's (torch appends "/text_summary")
        summary.value[0].metadata.summary_description = SAMPLES_DESCRIPTION
        writer._get_file_writer().add_summary(summary, step)


def _wandb(run, prefix: str, histograms: dict, figure, rows: list, step: int) -> None:
    import wandb

    data = {f"{prefix}{name}": wandb.Histogram(np_histogram=(counts, edges)) for name, (counts, edges) in histograms.items()}
    if figure is not None:
        data[f"{prefix}category_confusion"] = wandb.Image(figure)
    if rows:
        data[f"{prefix}samples"] = wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)
    run.log({**data, "trainer/global_step": step})


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
