"""A readable report of an `OWAEventMetrics` result: headline metrics, a per-category table, sample events."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .decode.batch import EventBatch
from .events.event import CATEGORY_NAMES, Status
from .tokens.vocab import VocabMap

HEADLINE = (
    ("comparable_rate", "comparable events", "ratio"),
    ("count_accuracy", "event count right (per sequence)", "ratio"),
    ("category/macro_f1", "category macro F1", "ratio"),
    ("timestamp/abs_error_p95_ms", "timestamp abs error P95", "ms"),
    ("timestamp/signed_error_iqm_ms", "timestamp signed error IQM", "ms"),
    ("mouse/euclidean_pe_p95_pct", "mouse euclidean error P95", "%"),
    ("mouse/direction_error_p50_deg", "mouse direction error P50", "deg"),
    ("mouse/direction_error_p95_deg", "mouse direction error P95", "deg"),
    ("mouse/action_accuracy", "mouse button accuracy", "ratio"),
    ("keyboard/accuracy", "keyboard accuracy (vk and action)", "ratio"),
)
CATEGORY_COLUMNS = ("count", "ratio", "comparable_rate", "timestamp/abs_error_p95_ms", "timestamp/signed_error_iqm_ms",
                    "timestamp/precision_p3", "loss")


def _fmt(value) -> str:
    if value is None:
        return "–"
    value = float(value)
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 10 else f"{value:.4g}"


def format_report(metrics: dict, title: str = "OWA event metrics", samples: Optional[str] = None) -> str:
    """Markdown: the headline metrics, one row per event category, and an optional samples section."""
    lines = [f"# {title}", "", "| metric | value | unit |", "|---|---|---|"]
    for key, name, unit in HEADLINE:
        if key in metrics:
            lines.append(f"| {name} | {_fmt(metrics[key])} | {unit} |")
    lines += ["", "| category | " + " | ".join(CATEGORY_COLUMNS) + " |", "|---" * (len(CATEGORY_COLUMNS) + 1) + "|"]
    for cat in CATEGORY_NAMES:
        cells = [_fmt(metrics.get(f"{cat}/{column}")) for column in CATEGORY_COLUMNS]
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    statuses = [f"{s.label} {_fmt(metrics[f'status/{s.label}'])}" for s in Status if metrics.get(f"status/{s.label}")]
    lines += ["", "Statuses: " + (", ".join(statuses) or "none")]
    if samples:
        lines += ["", "## Samples", "", samples]
    return "\n".join(lines) + "\n"


SAMPLE_COLUMNS = ("seq", "event", "status", "predicted", "true")


def sample_rows(batch: EventBatch, preds: torch.Tensor, target: torch.Tensor, vocab: VocabMap,
                max_events: int = 20, sequences: Sequence[int] = (0,)) -> list[list[str]]:
    """The first events of some sequences: predicted tokens next to the true ones, and the status.

    Inspection only (a short loop over at most ``max_events`` rows per sequence, never in ``update``).
    """
    rows: list[list[str]] = []
    shown: dict[int, int] = {}
    for i, (b, status) in enumerate(zip(batch.seq_idx.tolist(), batch.status.tolist())):
        k = shown.get(b, 0)
        if b not in sequences or k >= max_events:
            continue
        shown[b] = k + 1
        rows.append([str(b), str(k), Status(status).label, _span_text(preds[b], batch.pred, i, vocab),
                     _span_text(target[b], batch.target, i, vocab)])
    return rows


def markdown_table(rows: list[list[str]], columns: Sequence[str] = SAMPLE_COLUMNS) -> str:
    escape = lambda cell: cell.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows])


def _span_text(row: torch.Tensor, side, i: int, vocab: VocabMap, limit: int = 12) -> str:
    start, end = int(side.start[i]), int(side.end[i])
    if start < 0:
        return "(none)"
    tokens = [vocab.token(int(t)) for t in row[start:end + 1].tolist()]
    shown = "".join("·" if t is None else t for t in tokens[:limit])
    return shown + "…" if len(tokens) > limit else shown
