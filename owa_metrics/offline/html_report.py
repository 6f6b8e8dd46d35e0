"""The offline report as one HTML file a person opens (``owa-metrics evaluate ... --html report.html``).

Self-contained: the figures are inline PNGs (``data:`` URLs), the zoom buttons' script and the style inline, and a
Content-Security-Policy that lets the page load nothing else. Token files: the headline table with each key's
direction, the per-category and per-tag tables, the D2E keys and latency curve (when the report has them), the
category confusion, and the timelines of the ``sequences`` sequences with the most errors (`sequence_errors`) and of
the first ``sequences``. MCAP pairs under the D2E protocol: the D2E table and latency curve, a row per file (its name
links to its timeline when drawn), the timelines of the files with the most wrong (bin, name) counts and of the first.
A long sequence is drawn wider (`timeline_width_in`), shown at its size in a box that scrolls, and zoomed in the page.
"""

from __future__ import annotations

import base64
import html
import warnings
from pathlib import Path
from typing import Optional, Sequence

from ..decode.batch import decode_batch
from ..figures import (batch_timelines, confusion_figure, draw_latency_curve, draw_timeline, png_of, recording_timeline,
                       sequence_errors)
from ..functional.report import HEADLINE, higher_is_better
from ..metrics.collection import OWAEventMetrics
from ..report import format_number, format_report, tag_rows, unit_of

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1200px; padding: 0 16px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; } code { font-size: 12px; color: #555; }
.figure { margin: 12px 0 28px; } .tools button { font-size: 13px; margin-right: 4px; }
.scroll { overflow: auto; max-height: 900px; border: 1px solid #eee; } .scroll img { display: block; max-width: none; }
.wide { overflow-x: auto; }
.note { color: #555; }
"""
# the zoom buttons: the image's width times a factor (the scroll box pans), or back to the page's width
SCRIPT = """
function zoom(button, factor) {
  const img = button.closest('.figure').querySelector('img');
  img.style.width = (img.getBoundingClientRect().width * factor) + 'px';
}
function fit(button) { button.closest('.figure').querySelector('img').style.width = '100%'; }
document.body.dataset.ready = 'yes';
"""
POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
DIRECTION = {True: "↑ higher", False: "↓ lower", None: "–"}


def page(title: str, body: list[str]) -> str:
    """The whole document."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            f'<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n'
            f'<h1>{html.escape(title)}</h1>\n' + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def table(header: Sequence[str], rows: list[Sequence[str]], raw: bool = False) -> str:
    """An HTML table; cells escaped unless ``raw`` (cells that hold markup of their own)."""
    cell = (lambda x: str(x)) if raw else (lambda x: html.escape(str(x)))  # noqa: E731
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(x)}</td>" for x in row) + "</tr>\n" for row in rows)
    return f'<div class="wide"><table><tr>{head}</tr>\n{body}</table></div>'


def markdown_html(markdown: str) -> str:
    """The report's markdown (`format_report`: headings, pipe tables, paragraphs) as HTML."""
    out, lines = [], markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append([c.strip().replace("\\|", "|").replace("\\\\", "\\")
                              for c in lines[i].strip().strip("|").split(" | ")])
                i += 1
            out.append(table(block[0], block[2:]))
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level + 1}>{html.escape(line[level:].strip())}</h{level + 1}>")
        elif line.strip():
            out.append(f'<p class="note">{html.escape(line)}</p>')
        i += 1
    return "\n".join(out)


def headline_table(report: dict) -> str:
    """The headline keys present: words, value, unit, which way is better, key."""
    rows = [(words, format_number(report[key], unit), unit, DIRECTION[higher_is_better(key)], key)
            for key, words, unit, _ in HEADLINE if key in report]
    return table(("metric", "value", "unit", "better", "key"), rows)


def every_key(report: dict) -> str:
    """Every key of the report in a closed section."""
    rows = [(key, format_number(value, unit_of(key)), unit_of(key), DIRECTION[higher_is_better(key)])
            for key, value in report.items()]
    return (f"<details><summary>every key ({len(rows)})</summary>" + table(("key", "value", "unit", "better"), rows)
            + "</details>")


def figure(png: bytes, caption: str, anchor: Optional[str] = None, zoom: bool = False) -> str:
    """An inline PNG with its caption, at its own size; ``zoom``: in a box that scrolls (a long recording's wide
    timeline: sideways), with buttons that zoom in and out and fit it to the page's width."""
    data = base64.b64encode(png).decode("ascii")
    tools = ('<div class="tools"><button onclick="zoom(this, 1.6)">zoom in</button>'
             '<button onclick="zoom(this, 1 / 1.6)">zoom out</button><button onclick="fit(this)">fit</button></div>'
             if zoom else "")
    ident = f' id="{html.escape(anchor)}"' if anchor else ""
    img = f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
    return (f'<div class="figure"{ident}><div><b>{html.escape(caption)}</b></div>{tools}'
            + (f'<div class="scroll">{img}</div></div>' if zoom else f"{img}</div>"))


def timeline_width_in(duration_ns: int) -> float:
    """A timeline's width: 12 in up to 20 s, then 0.6 in a second (a 10-minute recording: 360 in), at most 600 in
    (matplotlib's 2**16 px at 100 dpi); the page shows it at its size, to scroll through, zoom or fit."""
    return min(max(12.0, duration_ns / 1e9 * 0.6), 600.0)


def d2e_section(report: dict, bin_ms: Optional[float]) -> list[str]:
    """The pooled D2E keys as a table (shift keys apart, in the latency curve) and the latency curve."""
    keys = [k for k in report if k.startswith("d2e/") and "_shift_" not in k.replace("best_shift_bins", "")]
    if not keys:
        return []
    out = ["<h2>D2E protocol</h2>", table(("key", "value", "better"), [
        (k, f"{report[k]:.6g}", DIRECTION[higher_is_better(k)]) for k in keys])]
    curve = draw_latency_curve(report, bin_ms) if bin_ms else None
    if curve is not None:
        out.append(figure(png_of(curve), "latency curve: the scores with the prediction moved by k bins"))
    return out


def token_report_html(report: dict, pred_path, target_path, *, format: Optional[str] = None,
                      pairing: str = "index", tolerance_ms=None, generated_screens: str = "context",
                      image_tokens: Optional[str] = None, sequences: int = 4, batch_size: int = 64) -> str:
    """The page of a token-file evaluation (`evaluate.evaluate`'s ``report``): the files read again in
    this process, each sequence's errors counted (`sequence_errors`), the confusion counted, the chosen sequences
    decoded once more and drawn. Returns the page."""
    from .evaluate import _pad, _vocab, guess_format, read_tagged, to_ids

    pred_path, target_path = Path(pred_path), Path(target_path)
    (pred_contents, pred_tags), (target_contents, target_tags) = read_tagged(pred_path), read_tagged(target_path)
    format = format or guess_format(target_contents, pred_contents) or "hierarchical"
    tokenizer, vocab = _vocab(format, image_tokens)
    preds, targets = (to_ids(c, tokenizer, vocab) for c in (pred_contents, target_contents))
    tags = target_tags or pred_tags
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", pairing=pairing, tolerance_ms=tolerance_ms,
                             generated_screens=generated_screens)
    errors = []
    for first in range(0, len(targets), batch_size):
        p, t = _pad(preds[first:first + batch_size]), _pad(targets[first:first + batch_size])
        metric.update(p, t)
        batch = decode_batch(*metric.scored_ids(p, t), vocab, "generation", pairing=pairing, tolerance_ms=tolerance_ms)
        errors += sequence_errors(batch).tolist()
    worst = [k for k in sorted(range(len(errors)), key=lambda k: (-errors[k], k)) if errors[k]][:sequences]
    chosen = sorted({*worst, *range(min(sequences, len(targets)))})
    drawn = {}
    if chosen:
        p, t = _pad([preds[k] for k in chosen]), _pad([targets[k] for k in chosen])
        batch = decode_batch(*metric.scored_ids(p, t), vocab, "generation", pairing=pairing, tolerance_ms=tolerance_ms)
        context = decode_batch(t, t, vocab) if generated_screens == "context" else None  # the true screens, drawn
        where = "recording" if target_path.suffix == ".mcap" else "line"
        names = [f"{target_path.name} {where} {k + 1} ({errors[k]} errors)" for k in chosen]
        captions = [f"{where} {k + 1}: {errors[k]} errors" for k in chosen]
        row_tags = [tags[k] for k in chosen] if tags else None
        for k, caption, timeline in zip(chosen, captions, batch_timelines(
                batch, vocab.config.timestamp_window_ns, range(len(chosen)), None, row_tags, names, context)):
            drawn[k] = figure(png_of(draw_timeline(timeline, timeline_width_in(timeline.end_ns))), caption,
                              f"sequence-{k + 1}", zoom=True)
    title = f"OWA event metrics: {pred_path.name} vs {target_path.name}"
    markdown = format_report(report, title, alignment="generation")
    rest = markdown[markdown.index("| category |"):]  # the headline is drawn with its directions above
    settings = (f"{len(targets)} sequences; {format} format; pairing {pairing}"
                + (f" (tolerance {metric.tolerance_ms} ms)" if pairing == "time" else "")
                + f"; screens {generated_screens}")
    body = [f'<p class="note">{html.escape(settings)}</p>', "<h2>Headline</h2>", headline_table(report),
            "<h2>Per category</h2>", markdown_html(rest), *d2e_section(report, None),
            "<h2>Category confusion</h2>",
            figure(png_of(confusion_figure(metric.confusion_matrix(sync=False), "category confusion")),
                   "target x predicted category")]
    body.append(f"<h2>Timelines: the {len(worst)} sequences with the most errors</h2>")
    body += [drawn[k] for k in worst]
    first = range(min(sequences, len(targets)))
    body.append(f"<h2>Timelines: the first {len(first)} sequences</h2>")
    body += [drawn[k] if k not in worst else
             f'<p class="note"><a href="#sequence-{k + 1}">sequence {k + 1}</a>: drawn above</p>' for k in first]
    body.append(every_key(report))
    return page(title, body)


def d2e_report_html(report: dict, pred, target, bin_ms: float, sequences: int = 4) -> str:
    """The page of a D2E evaluation of two MCAP recordings or two folders of them (`d2e`'s ``report``):
    the D2E table and latency curve, a row per file (folders) whose name links to its timeline when drawn, and the
    timelines of the files with the most wrong (bin, name) counts and of the first ``sequences``. Returns the page."""
    from .d2e import pair_folders
    from ..events.d2e import NoRawMouseWarning, read_d2e_recording

    pred, target = Path(pred), Path(target)
    pairs = pair_folders(pred, target) if pred.is_dir() else [(target.stem, pred, target)]
    columns, by_file = tag_rows(report)

    def wrong(stem: str) -> float:
        keys = report if len(pairs) == 1 else {k.split("/", 2)[2]: v for k, v in report.items()
                                                if k.startswith(f"tag/{stem}/")}
        return sum(keys.get(f"d2e/{kind}/sample_count", 0) * (1 - keys.get(f"d2e/{kind}/{name}", 1))
                   for kind, name in (("keyboard", "key_accuracy"), ("mouse_button", "button_accuracy")))

    order = [i for i in sorted(range(len(pairs)), key=lambda i: (-wrong(pairs[i][0]), i)) if wrong(pairs[i][0])]
    worst = order[:sequences]
    chosen = sorted({*worst, *range(min(sequences, len(pairs)))})
    drawn = {}
    for i in chosen:
        stem, p, t = pairs[i]
        with warnings.catch_warnings():  # read again for its figure: the evaluation has said what the file lacks
            warnings.simplefilter("ignore", NoRawMouseWarning)
            truth, guess = read_d2e_recording(t), read_d2e_recording(p)
        timeline = recording_timeline(truth, guess, f"{stem}: {wrong(stem):.0f} wrong (bin, name) counts", bin_ms)
        drawn[i] = figure(png_of(draw_timeline(timeline, timeline_width_in(timeline.end_ns))), stem, f"file-{stem}",
                          zoom=True)
    title = f"D2E protocol: {pred.name} vs {target.name} ({bin_ms:g} ms bins)"
    body = d2e_section({k: v for k, v in report.items() if not k.startswith("tag/")}, bin_ms)
    if by_file:
        links = {stem: (f'<a href="#file-{html.escape(stem)}">{html.escape(stem)}</a>' if i in drawn
                        else html.escape(stem)) for i, (stem, _, _) in enumerate(pairs)}
        body += ["<h2>Per file</h2>", table(["file", *columns], [
            [links[stem], *(html.escape(format_number(row.get(key), unit_of(key)) if unit_of(key) == "count"
                                        else f"{row[key]:.4g}" if key in row else "–") for key in columns)]
            for stem, row in by_file.items()], raw=True)]
    body.append(f"<h2>Timelines: the files with the most wrong counts, then the first {sequences}</h2>")
    body += [drawn[i] for i in dict.fromkeys([*worst, *chosen])]
    body.append(every_key(report))
    return page(title, body)

