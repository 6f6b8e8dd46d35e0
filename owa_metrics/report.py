"""A readable report of an `OWAEventMetrics` result: headline metrics, a per-category table, sample events."""

from __future__ import annotations

import textwrap
from dataclasses import fields, replace
from itertools import groupby
from typing import Optional, Sequence

import torch

from .decode.event_batch import Alignment, EventBatch, EventFields
from .schema import CATEGORY_NAMES, Category, Status
from .functional.events import direction_error_deg, timestamp_errors
from .functional.report import HEADLINE
from .tokens.codec import CodecConfig
from .tokens.vocab import VocabMap

TEACHER_FORCING = "teacher_forcing"
# (key within the category, unit, the only alignment it applies to or None)
CATEGORY_COLUMNS = (("count", "count", None), ("ratio", "ratio", None), ("comparable_rate", "ratio", None),
                    ("timestamp/abs_error_p95_ms", "ms", None), ("timestamp/signed_error_iqm_ms", "ms", None),
                    ("timestamp/precision_p3", "ratio", None), ("loss", "nats", TEACHER_FORCING))
DECIMALS = {"count": 0, "ratio": 4, "ms": 1, "%": 1, "deg": 1, "nats": 3, "mu": 1}
PERCENT_NOTE = ("Percent errors divide by the true value: a true move of 1 px predicted as 20 px is 1,900 %, so P95 "
                "and R² swing with tiny true moves; the IQM (IQMPE) and the direction error are robust to them.")


def format_number(value, unit: str) -> str:
    """One format per unit: fixed decimals (`DECIMALS`), thousands separated by commas; "–" for a missing value."""
    if value is None:
        return "–"
    text = f"{float(value):,.{DECIMALS[unit]}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # no "-0.0"


def format_report(metrics: dict, title: str = "OWA event metrics", samples: Optional[str] = None,
                  alignment: Alignment = TEACHER_FORCING) -> str:
    """Markdown: the headline metrics, one row per event category, the statuses and optional samples; only the
    rows and columns that apply to ``alignment`` and have a value."""
    applies = lambda only: only in (None, alignment)  # noqa: E731
    lines = [f"# {title}", "", "| metric | value | unit |", "|---|---:|---|"]
    for key, name, unit, only in HEADLINE:
        if key in metrics and applies(only):
            lines.append(f"| {name} | {format_number(metrics[key], unit)} | {unit} |")
    columns = [(key, unit) for key, unit, only in CATEGORY_COLUMNS
               if applies(only) and any(f"{cat}/{key}" in metrics for cat in CATEGORY_NAMES)]
    lines += ["", "| category | " + " | ".join(key for key, _ in columns) + " |", "|---" + "|---:" * len(columns) + "|"]
    for cat in CATEGORY_NAMES:
        cells = [format_number(metrics.get(f"{cat}/{key}"), unit) for key, unit in columns]
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    statuses = [f"{s.label} {format_number(metrics[f'status/{s.label}'], 'count')}" for s in Status
                if metrics.get(f"status/{s.label}")]
    lines += ["", "Statuses: " + (", ".join(statuses) or "none")]
    if any(key.startswith("mouse/euclidean") for key in metrics):
        lines += ["", PERCENT_NOTE]
    tags = tag_table(metrics)
    if tags:
        lines += ["", "## Per tag", "", tags]
    if samples:
        lines += ["", "## Samples", "", samples]
    return "\n".join(lines) + "\n"


def unit_of(key: str) -> str:
    """A key's unit (`DECIMALS`), read from its name: names carry their units."""
    units = {"_ms": "ms", "_pct": "%", "_deg": "deg", "_mu": "mu", "/loss": "nats", "/loss_sum": "nats"}
    unit = next((u for suffix, u in units.items() if key.endswith(suffix)), "ratio")
    counted = key.startswith(("count/", "status/")) and not key.endswith("_rate") or key.endswith("/count")
    return "count" if counted else unit


def tag_rows(metrics: dict) -> tuple[list[str], dict[str, dict]]:
    """The per-tag keys (``tag/{name}/{key}``): ``(columns, {tag: {key: value}})``, the counts first."""
    rows: dict[str, dict] = {}
    for key, value in metrics.items():
        if key.startswith("tag/"):
            name, key = key[len("tag/"):].split("/", 1)
            rows.setdefault(name, {})[key] = value
    columns = sorted(dict.fromkeys(key for row in rows.values() for key in row), key=lambda k: unit_of(k) != "count")
    return columns, rows


def tag_table(metrics: dict) -> Optional[str]:
    """`tag_rows` as a markdown table, a row per tag and a column per key ("–": no value); None without any. A tag's
    name is one cell whatever it holds: ``\\`` and ``|`` are escaped (markdown reads ``\\|`` as ``|``; a name holds
    no line break: `OWAEventMetrics` refuses it)."""
    columns, rows = tag_rows(metrics)
    if not rows:
        return None
    rows = {name.replace("\\", "\\\\").replace("|", "\\|"): row for name, row in rows.items()}  # one cell each
    lines = ["| tag | " + " | ".join(columns) + " |", "|---" + "|---:" * len(columns) + "|"]
    return "\n".join(lines + [f"| {name} | " + " | ".join(format_number(row.get(key), unit_of(key)) for key in columns)
                              + " |" for name, row in rows.items()])


SAMPLE_COLUMNS = ("seq", "event", "status", "true", "predicted", "errors")
KEY_NAMES = {8: "Backspace", 9: "Tab", 13: "Enter", 16: "Shift", 17: "Ctrl", 18: "Alt", 27: "Esc", 32: "Space",
             37: "Left", 38: "Up", 39: "Right", 40: "Down", 46: "Delete", 91: "Win", 160: "LShift", 161: "RShift",
             162: "LCtrl", 163: "RCtrl", 164: "LAlt", 165: "RAlt",
             **{vk: chr(vk) for vk in (*range(48, 58), *range(65, 91))}, **{111 + n: f"F{n}" for n in range(1, 13)}}
BUTTON_NAMES = ((0x001, "left down"), (0x002, "left up"), (0x004, "right down"), (0x008, "right up"),
                (0x010, "middle down"), (0x020, "middle up"), (0x040, "x1 down"), (0x080, "x1 up"), (0x100, "x2 down"),
                (0x200, "x2 up"), (0x400, "wheel"), (0x800, "hwheel"))  # Windows RAWMOUSE usButtonFlags
WHEEL, HWHEEL = 0x400, 0x800
NO_EVENT = "(no event)"


def sample_rows(batch: EventBatch, preds: torch.Tensor, target: torch.Tensor, vocab: VocabMap,
                max_rows: int = 24, sequences: Sequence[int] = (0,)) -> list[list[str]]:
    """At most ``max_rows`` rows of `SAMPLE_COLUMNS` over the target events of ``sequences``, chosen so that every
    category present shows: the categories take turns (keyboard, mouse_op, mouse_nop, screen, then targets that do
    not decode), each giving its next event in (sequence, position) order; the rows keep that order. Both events in
    words (``mouse_nop 1.23 s dx -3 dy +64``, ``keyboard 0.50 s key 65 (A) press``) or the raw tokens of one that
    does not decode (cut at its own ``<EVENT_END>``), and a comparable pair's errors (``Δt +20 ms, Δ (-2, -4) px,
    dir 2.1°``). The rows of TensorBoard's text, the W&B table and ``epoch_{E}_step_{S}.md``; any token format.

    Inspection only: a short loop over the shown rows, never in ``update``.
    """
    seq = batch.seq_idx.cpu()
    first = torch.searchsorted(seq, seq)  # rows are in (sequence, position) order
    rank = torch.arange(len(seq)) - first
    shown = torch.isin(seq, torch.as_tensor(list(sequences), dtype=seq.dtype)).nonzero()[:, 0].tolist()
    invalid = batch.status.cpu() == int(Status.INVALID_TARGET)
    group = torch.where(invalid, len(CATEGORY_NAMES), batch.target.category.cpu().long())
    queues = [[i for i in shown if int(group[i]) == g] for g in range(len(CATEGORY_NAMES) + 1)]
    picked: list[int] = []
    while len(picked) < max_rows and any(queues):
        picked += [queue.pop(0) for queue in queues if queue][:max_rows - len(picked)]
    index = torch.tensor(sorted(picked), dtype=torch.long)
    pred, true = (_cpu(side.take(index.to(side.status.device))) for side in (batch.pred, batch.target))
    dt_ms, _ = timestamp_errors(pred.timestamp_ns, true.timestamp_ns, vocab.config.timestamp_window_ns)
    direction = direction_error_deg(torch.stack([pred.dx, pred.dy], 1), torch.stack([true.dx, true.dy], 1))
    preds, target = preds.cpu(), target.cpu()
    if batch.alignment == TEACHER_FORCING:  # as the decoder: positions ignored in the target are in the prediction
        preds = torch.where(target < 0, -100, preds)
    rows = []
    for r, i in enumerate(index.tolist()):
        b, status = int(seq[i]), Status(int(batch.status[i]))
        errors = _errors(pred, true, r, float(dt_ms[r]), float(direction[r])) if status == Status.VALID else "–"
        rows.append([str(b), str(int(rank[i])), status.label, _side_text(target[b], true, r, vocab),
                     _side_text(preds[b], pred, r, vocab), errors])
    return rows


def sample_note(config: CodecConfig) -> str:
    """What the sample table's shorthand means, and which clock its times read."""
    return (f"Times are within the format's {config.timestamp_window_ns / 1e9:g} s timestamp window (the tokens write "
            "the time modulo it). `<t>×N`: a run of N identical tokens; `·`: an ignored label (-100, e.g. an image "
            "token of a screen).")


def sample_table(rows: list[list[str]], columns: Sequence[str] = SAMPLE_COLUMNS, max_width: int = 34) -> str:
    """The rows as a fenced block of aligned columns: markdown (TensorBoard's text, ``epoch_{E}_step_{S}.md``) shows it as it
    is, in a monospace font that never wraps a cell; a cell wider than ``max_width`` continues on the next line
    (between tokens or words), so that the table stays at most 136 characters wide (TensorBoard's text tab shows it
    whole in a 1600 px window)."""
    cells = [[textwrap.wrap(c.replace("><", "> <"), max_width) or [c] for c in row] for row in rows]
    lines = [[str(c) for c in columns]] + [
        [part[k].replace("> <", "><") if k < len(part) else "" for part in row]
        for row in cells for k in range(max(map(len, row)))]
    widths = [max(len(line[j]) for line in lines) for j in range(len(columns))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join(["```", *text, "```"])


def _cpu(side: EventFields) -> EventFields:
    return replace(side, **{f.name: getattr(side, f.name).cpu() for f in fields(side)
                            if isinstance(getattr(side, f.name), torch.Tensor)})


def _side_text(row: torch.Tensor, side: EventFields, r: int, vocab: VocabMap, max_pieces: int = 16) -> str:
    """The event in words, or its raw tokens cut at its own end (runs as ``<image>×64``, ignored labels as ``·``)."""
    start, end = int(side.start[r]), int(side.end[r])
    if start < 0:
        return NO_EVENT
    if int(side.status[r]) == int(Status.VALID):
        return _words(side, r, vocab.config)
    tokens = [vocab.token(t) for t in row[start:end + 1].tolist()]
    if vocab.config.event_end in tokens:
        tokens = tokens[:tokens.index(vocab.config.event_end) + 1]
    pieces = [f"{token}×{n}" if n > 4 else token * n
              for token, n in ((t, len(list(run))) for t, run in groupby("·" if t is None else t for t in tokens))]
    return "".join(pieces[:max_pieces]) + ("…" if len(pieces) > max_pieces else "")


def _words(side: EventFields, r: int, config: CodecConfig) -> str:
    """A decoded event in words: category, timestamp in the window, then the kind's fields."""
    category = Category(int(side.category[r]))
    decimals = max(0, len(str(1_000_000_000 // config.timestamp_unit_ns)) - 1)
    head = f"{category.name.lower()} {int(side.timestamp_ns[r]) / 1e9:.{decimals}f} s"
    if category == Category.KEYBOARD:
        vk = int(side.vk[r])
        name = f" ({KEY_NAMES[vk]})" if vk in KEY_NAMES else ""
        return f"{head} key {vk}{name} {'release' if int(side.action[r]) else 'press'}"
    if category == Category.SCREEN:
        return head
    text = f"{head} dx {int(side.dx[r]):+d} dy {int(side.dy[r]):+d}"
    flags, data = int(side.button_flags[r]), int(side.button_data[r])
    wheel = flags & (WHEEL | HWHEEL)
    names = [f"{name} {data // config.scroll_unit:+d}" if bit & wheel and data else name
             for bit, name in BUTTON_NAMES if flags & bit]
    unknown = flags & ~sum(bit for bit, _ in BUTTON_NAMES)
    return " ".join([text, *names] + ([f"flags 0x{unknown:03x}"] if unknown else [])
                    + ([f"data {data:+d}"] if data and not wheel else []))


def _errors(pred: EventFields, true: EventFields, r: int, dt_ms: float, direction_deg: float) -> str:
    parts = [f"Δt {dt_ms:+,.0f} ms"]
    mark = lambda right: "right" if right else "wrong"  # noqa: E731
    category = Category(int(true.category[r]))
    if category == Category.KEYBOARD:
        parts += [f"key {mark(int(pred.vk[r]) == int(true.vk[r]))}",
                  f"action {mark(int(pred.action[r]) == int(true.action[r]))}"]
    elif category in (Category.MOUSE_OP, Category.MOUSE_NOP):
        parts.append(f"Δ ({int(pred.dx[r]) - int(true.dx[r]):+d}, {int(pred.dy[r]) - int(true.dy[r]):+d}) px")
        if direction_deg == direction_deg:  # not NaN: the true move is not zero
            parts.append(f"dir {direction_deg:.1f}°")
        if int(true.button_flags[r]):
            parts.append(f"buttons {mark(int(pred.button_flags[r]) == int(true.button_flags[r]))}")
        if int(true.button_data[r]):
            parts.append(f"wheel {mark(int(pred.button_data[r]) == int(true.button_data[r]))}")
    return ", ".join(parts)
