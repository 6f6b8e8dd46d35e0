"""What `OWAEventMetricsCallback` writes besides its scalars, on rank zero: histograms, the confusion figure, the
timelines and the latency curve, and the sample table to the loggers that show them, TensorBoard's Custom Scalars
layout, and the report files (``.json`` / ``.md`` / ``.png``) where each logger keeps a run's files. Nothing here
touches a collective: every rank has computed before rank zero gets here."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from ..schema import CATEGORY_NAMES
from ..figures import confusion_figure
from ..functional.report import WORDS
from ..report import SAMPLE_COLUMNS, tag_rows, tag_table, unit_of

HISTOGRAM_RANGE = ("Range, per epoch: P2..P98 of the values, narrowed to Tukey's fences (Q1 - 1.5 IQR, Q3 + 1.5 "
                   "IQR); 50 bins; values outside the range are counted in the first and last bin.")
TAGS_DESCRIPTION = "One row per tag seen in the epoch: the report of its sequences alone (OWAEventMetrics' tag_keys)."
SAMPLES_DESCRIPTION = ("One row per target event of the first sequences: the true and the predicted event in words "
                       "(the raw tokens of one that does not decode) and a comparable pair's errors.")


# The breakdown charts' groups (TensorBoard and W&B group charts by a name's first ``/`` part): a key goes to the first
# section one of whose patterns (fnmatch) it matches, so that a run has a few groups, not one per key family
SECTIONS = (("tags", ("tag/*",)), ("d2e", ("d2e/*",)), ("detection", ("detect/*",)), ("timestamp", ("timestamp/*", "*/timestamp/*")),
            ("tokens", ("token_accuracy/*", "*/loss", "*/loss_sum", "count/loss_skipped_tokens")),
            ("events", tuple(f"{cat}/{key}" for cat in CATEGORY_NAMES for key in ("count", "ratio", "comparable_rate"))),
            ("mouse", ("mouse/*", "mouse_op/*")), ("keyboard", ("keyboard/*",)), ("events", ("*",)))


def breakdown_name(key: str, prefix: str) -> str:
    """The chart name of a key that is not a headline key: ``{group}.{section}/{key}``, the group being the prefix's
    parts joined by dots (``val/owa/`` + ``keyboard/timestamp/precision_p1`` ->
    ``val.owa.timestamp/keyboard/timestamp/precision_p1``): the key whole after the first ``/``."""
    section = next(name for name, patterns in SECTIONS if any(fnmatch.fnmatchcase(key, p) for p in patterns))
    return ".".join(part for part in (*prefix.split("/"), section) if part) + "/" + key


def log_breakdowns(loggers: list[Logger], scalars: dict[str, float], step: int) -> None:
    """The breakdown scalars straight to each logger (its own ``log_metrics``: TensorBoard, W&B, CSV, MLflow, ...),
    on rank zero: nothing of them goes through Lightning's ``callback_metrics`` (under ``ddp_spawn`` those travel
    back to the main process through a pipe that blocks past 64 KiB)."""
    if scalars:
        for logger in loggers:
            logger.log_metrics(scalars, step)


def histogram_ranges(histograms: dict) -> str:
    """A markdown table of each histogram's range, bin width and number of values, and how the range is chosen:
    TensorBoard's default loader shows text but not a histogram's description."""
    lines = ["| histogram | from | to | bin width | values |", "|---|---:|---:|---:|---:|"]
    for name, (counts, edges) in histograms.items():
        unit = name.rsplit("_", 1)[-1].replace("pct", "%").replace("deg", "°")
        lines.append(f"| {name} | {edges[0]:,.4g} {unit} | {edges[-1]:,.4g} {unit} | "
                     f"{edges[1] - edges[0]:,.3g} {unit} | {counts.sum():,.0f} |")
    return "\n".join(lines + ["", HISTOGRAM_RANGE])


def log_extras(loggers: list[Logger], prefix: str, suffix: str, histograms: dict, confusion, samples: Optional[str],
               rows: list, step: int, title: str, report: Optional[dict] = None) -> None:
    """Histograms, the confusion figure, the samples and the per-tag table of ``report`` (`tag_rows`) to TensorBoard
    (text) and W&B (tables), named ``{prefix}{name}{suffix}``."""
    figure = confusion_figure(confusion, title) if confusion is not None else None
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            _tensorboard(logger.experiment, prefix, suffix, histograms, figure, samples, step, tag_table(report or {}))
        elif isinstance(logger, WandbLogger):
            _wandb(logger.experiment, prefix, suffix, histograms, figure, rows, step, tag_rows(report or {}))


def log_images(loggers: list[Logger], prefix: str, suffix: str, images: dict[str, bytes], step: int) -> None:
    """PNG images to TensorBoard (image summaries of the encoded PNG) and W&B (``wandb.Image``), named
    ``{prefix}{name}{suffix}``."""
    if not images:
        return
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            from tensorboard.compat.proto.summary_pb2 import Summary

            for name, png in images.items():
                width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR
                image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png)
                logger.experiment.file_writer.add_summary(
                    Summary(value=[Summary.Value(tag=f"{prefix}{name}{suffix}", image=image)]), step)
        elif isinstance(logger, WandbLogger):
            import io

            import wandb
            from PIL import Image

            logger.experiment.log({**{f"{prefix}{name}{suffix}": wandb.Image(Image.open(io.BytesIO(png)))
                                      for name, png in images.items()}, "trainer/global_step": step})


def headline_layout(loggers: list[Logger], prefix: str, charts: dict[str, str]) -> None:
    """TensorBoard's Custom Scalars tab: one category, ``OWA headline ({prefix})``, a chart per headline key
    (``charts``: logged name -> key), titled with the key's words and unit, so that the headline is the first view."""
    tensorboards = [logger for logger in loggers if isinstance(logger, TensorBoardLogger)]
    if not tensorboards or not charts:
        return
    from torch.utils.tensorboard.summary import custom_scalars

    def title(name: str, key: str) -> str:
        unit = unit_of(key)
        return f"{WORDS.get(key, key)} ({unit})" + name[len(prefix) + len(key):]

    charts = {title(name, key): ["Multiline", [re.escape(name)]] for name, key in charts.items()}  # (tags are regexes)
    layout = {f"OWA headline ({prefix})": charts}
    for logger in tensorboards:
        logger.experiment.file_writer.add_summary(custom_scalars(layout))


def save_reports(loggers: list[Logger], folder: Optional[Path], files: dict[str, str | bytes]) -> None:
    """Write ``files`` (relative path -> text or PNG bytes) into the run of each logger that keeps files, and into
    ``folder`` when given.

    TensorBoard / CSV: ``{log_dir}/owa_metrics/``; W&B: the run's files (``run.dir``, synced with the run); MLflow:
    the run's artifacts under ``owa_metrics/``."""
    places = [Path(folder)] if folder is not None else []
    for logger in loggers:
        if isinstance(logger, (TensorBoardLogger, CSVLogger)):
            places.append(Path(logger.log_dir) / "owa_metrics")
        elif isinstance(logger, WandbLogger):
            places.append(Path(logger.experiment.dir) / "owa_metrics")
        elif isinstance(logger, MLFlowLogger):
            with tempfile.TemporaryDirectory() as tmp:
                for name, path in zip(files, _write_all(Path(tmp), files)):
                    parent = Path("owa_metrics", name).parent.as_posix()
                    logger.experiment.log_artifact(logger.run_id, str(path), artifact_path=parent)
        else:
            rank_zero_warn(f"OWAEventMetricsCallback: {type(logger).__name__} keeps no run folder known to "
                           "owa-metrics; the report files are not written there (pass artifacts_dir= to choose one)")
    for place in dict.fromkeys(places):
        _write_all(place, files)


def _write_all(folder: Path, files: dict[str, str | bytes]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(text) if isinstance(text, bytes) else tmp.write_text(text)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        paths.append(path)
    return paths


def report_json(report: dict, **context) -> str:
    return json.dumps({**context, **report}, indent=1)


def _histogram_summary(tag: str, counts: np.ndarray, edges: np.ndarray):
    """A TensorBoard histogram summary with its range described (what the tag's info says)."""
    from torch.utils.tensorboard.summary import histogram_raw

    centers = (edges[:-1] + edges[1:]) / 2
    summary = histogram_raw(tag, min=float(edges[0]), max=float(edges[-1]), num=float(counts.sum()),
                            sum=float((counts * centers).sum()), sum_squares=float((counts * centers ** 2).sum()),
                            bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist())
    summary.value[0].metadata.summary_description = HISTOGRAM_RANGE
    return summary


def _tensorboard(writer, prefix: str, suffix: str, histograms: dict, figure, samples: Optional[str], step: int,
                 tags: Optional[str] = None) -> None:
    from torch.utils.tensorboard.summary import text

    for name, (counts, edges) in histograms.items():
        writer.file_writer.add_summary(_histogram_summary(f"{prefix}{name}{suffix}", counts, edges), step)
    if figure is not None:
        writer.add_figure(f"{prefix}category_confusion{suffix}", figure, global_step=step, close=False)
    texts = {"samples": (samples, SAMPLES_DESCRIPTION),
             "histogram_ranges": (histogram_ranges(histograms) if histograms else None, HISTOGRAM_RANGE),
             "tags": (tags, TAGS_DESCRIPTION)}
    for name, (markdown, description) in texts.items():
        if markdown:
            summary = text(f"{prefix}{name}{suffix}", markdown)
            summary.value[0].tag = f"{prefix}{name}{suffix}"  # the tag as named, as W&B's (torch appends "/text_summary")
            summary.value[0].metadata.summary_description = description
            writer.file_writer.add_summary(summary, step)


def _wandb(run, prefix: str, suffix: str, histograms: dict, figure, rows: list, step: int,
           tags: tuple[list, dict]) -> None:
    import wandb

    data = {f"{prefix}{name}{suffix}": wandb.Histogram(np_histogram=(counts, edges))
            for name, (counts, edges) in histograms.items()}
    if figure is not None:
        data[f"{prefix}category_confusion{suffix}"] = wandb.Image(figure)
    if rows:
        numbers = [[int(seq), int(event), *rest] for seq, event, *rest in rows]  # seq and event as numbers
        data[f"{prefix}samples{suffix}"] = wandb.Table(columns=list(SAMPLE_COLUMNS), data=numbers)
    columns, by_tag = tags
    if by_tag:
        data[f"{prefix}tags{suffix}"] = wandb.Table(columns=["tag", *columns], data=[
            [name, *(row.get(key) for key in columns)] for name, row in by_tag.items()])
    run.log({**data, "trainer/global_step": step})
