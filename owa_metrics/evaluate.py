"""Offline evaluation: predicted vs true event sequences from files, one report.

A file is an OWA MCAP recording (one sequence: the whole recording), or text / JSONL with one sequence of
event tokens per line (JSONL: a JSON string, or an object with a "text" field and optionally a "tag": the report
then holds each tag's keys too, `OWAEventMetrics`' ``tags``). The k-th predicted sequence
is compared with the k-th true one, event by event (generation alignment; events paired by index, or by time
with ``pairing="time"``). The token format is the target
file's (`guess_format`; the prediction file's when the target's tokens cannot tell) unless one is named.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Optional, Union

import torch

from .schema import Event
from .metrics.collection import InvalidTargetsWarning, OWAEventMetrics
from .tokens.codec import FORMATS, EventCodec, EventEncodeError, possible_formats
from .tokens.vocab import VocabMap, build_tokenizer


MCAP_MAGIC = b"\x89MCAP0\r\n"


class InputError(ValueError):
    """A file the evaluator cannot read; the message names the file and says what is wrong with it."""


class FormatGuessWarning(UserWarning):
    """Neither file's tokens tell the token format (e.g. screens only): hierarchical is assumed; ``path`` is the
    target file's."""

    def __init__(self, path):
        self.path = path
        super().__init__(f"{path}: its tokens do not tell the token format (screens only, every digit < 10): "
                         "hierarchical assumed; pass format= to be sure, since the formats' timestamp windows differ "
                         "(16 s vs 10 s)")


class FormatMismatchWarning(UserWarning):
    """The two files' tokens tell different token formats (``told``: path -> format; e.g. predictions written by a
    factorized model against hierarchical targets): read in ``format``, the other file's events do not decode."""

    def __init__(self, told: dict, format: str):
        self.told, self.format = told, format
        said = " but ".join(f"{path} looks {name}" for path, name in told.items())
        super().__init__(f"{said}: read as {format}, the other file's events do not decode; write both files in one "
                         "format (write_sequences with the tokenizer that made each, and the same format for both)")


class UndecodedTargetsWarning(UserWarning):
    """`OWAEventMetrics`' warning that more than 5 % of the true events do not decode, with its numbers: the target
    file ``path``, ``count`` of ``total`` events, their most frequent failure ``reason`` and the ``format`` read."""

    def __init__(self, path, count: int, total: int, reason: str, format: str):
        self.path, self.count, self.total, self.reason, self.format = path, count, total, reason, format
        super().__init__(f"{path}: {count} of {total} true events ({count / total:.0%}) do not decode in the {format} "
                         f"format (most often: {reason}) and are left out of every rate; files in another format: "
                         f"pass format={' | '.join(map(repr, FORMATS))}")


def read_file(path: str | Path) -> list[str] | list[Event]:
    """A file's token texts (one per sequence), or an MCAP recording's events (see the module docstring); raises
    `InputError` saying what is wrong with the file."""
    return read_tagged(path)[0]


def read_tagged(path: str | Path) -> tuple[list[str] | list[Event], Optional[list[Optional[str]]]]:
    """`read_file`'s contents and each line's ``"tag"`` (None for a line without; no list when no line has one)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
    if path.suffix == ".mcap":
        return _read_mcap(path, data), None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                         "expected one token sequence per line, or an OWA .mcap recording") from None
    texts, tags = [], []
    for number, line in enumerate(_lines(text), 1):
        tag = None
        if path.suffix == ".jsonl" and line.strip():
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number}: not JSON ({err.msg})") from None
            line = item["text"] if isinstance(item, dict) and "text" in item else item
            if not isinstance(line, str):
                raise InputError(f"{path}:{number}: expected a string or an object with a 'text' field")
            tag = item.get("tag") if isinstance(item, dict) else None
            if tag is not None and not (isinstance(tag, str) and tag and "/" not in tag):
                raise InputError(f"{path}:{number}: 'tag' must be a name (a non-empty string without '/'), got {tag!r}")
        texts.append(line.strip())
        tags.append(tag)
    if not any(texts):
        raise InputError(f"{path}: no sequences (the file is empty or blank)")
    return texts, tags if any(tag is not None for tag in tags) else None


def _lines(text: str) -> list[str]:
    """The lines of ``text`` split at ``\\n`` and ``\\r\\n`` only (a form feed or U+2028 stays inside its line); a
    blank line is a line (an empty sequence), the final line break ends the last line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def check_mcap(path: Path, data: Optional[bytes] = None) -> None:
    """Raise `InputError` naming ``path`` unless it reads and opens and closes with the MCAP magic bytes."""
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as err:
            raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
    if not data.startswith(MCAP_MAGIC):
        raise InputError(f"{path}: not an MCAP file (it does not start with the MCAP magic bytes)")
    if len(data) < 2 * len(MCAP_MAGIC) or not data.endswith(MCAP_MAGIC):
        raise InputError(f"{path}: MCAP file truncated at byte {len(data)} (no closing magic bytes)")


def _read_mcap(path: Path, data: bytes) -> list[Event]:
    check_mcap(path, data)
    from .events import read_recording

    try:
        return read_recording(path)
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 - the reader's own errors say little: name the file
        raise InputError(f"{path}: unreadable MCAP recording ({type(err).__name__}: {err})") from None


def evaluation_warnings(report: dict, pred_path, target_path) -> list[str]:
    """What a person must know before trusting the numbers, besides `evaluate`'s warnings: a target without events,
    a prediction of which no event decodes."""
    out = []
    decoded = report.get("status/valid", 0) + report.get("status/type_mismatch", 0)
    if report.get("count/target_events", 0) == 0:
        out.append(f"{target_path}: no true event (no <EVENT_START> ... <EVENT_END> span)")
    elif report.get("count/valid_target_events", 0) and decoded == 0:
        out.append(f"{pred_path}: no predicted event decodes ({int(report.get('count/pred_events', 0))} event spans "
                   "found): every true event counts as missing or invalid")
    return out


_PIECES = re.compile(r"(<[^<>]*>)")


def told_format(content: list[str] | list[Event]) -> Optional[str]:
    """The one registered format that can have written the event tokens of ``content``'s texts (`possible_formats`),
    else None (no text, screens only, or tokens of no format)."""
    found = possible_formats(_held(content))
    return found[0] if len(found) == 1 else None


def _held(content: list[str] | list[Event]) -> set[str]:
    """Every ``<...>`` token of the texts: the text before each ">" from its last "<" (as _PIECES reads them)."""
    held = set()
    for text in (c for c in content if isinstance(c, str)):
        held.update(piece[piece.rfind("<"):] + ">" for piece in set(text.split(">")[:-1]) if "<" in piece)
    return held


def guess_format(*contents: list[str] | list[Event]) -> Optional[str]:
    """The format the first file whose tokens tell says: the one registered format that can have written its event
    tokens (`possible_formats`: ``<SIGN_PLUS>``, ``<VK_n>``, ``<MB_h>`` ... -> factorized; a digit above 9, or a
    keyboard / mouse event without those -> hierarchical). None when some text holds events but none tells (screens
    only: both formats write ``<SCREEN>`` + 3 digits < 10); hierarchical when no file is text with events
    (recordings, or no event at all)."""
    events = False
    starts = {spec.preset.event_start for spec in FORMATS.values()}
    for content in contents:
        held = _held(content)
        found = possible_formats(held)
        if len(found) == 1:
            return found[0]
        events = events or bool(held & starts)
    return None if events else "hierarchical"


def tokenize(text: str, vocab: dict[str, int], unk_id: int) -> list[int]:
    """The ids `build_tokenizer`'s tokenizer gives ``text`` (each ``<...>`` a token, each run of other text one
    token, unknown pieces ``unk_id``), by a regex split and a dict lookup: ~10x faster on long lines."""
    return [vocab.get(piece, unk_id) for piece in _PIECES.split(text) if piece]


def to_ids(contents: list[str] | list[Event], tokenizer, vocab: VocabMap) -> list[list[int]]:
    """Token ids: each text tokenized, or a recording's events encoded as one sequence."""
    if contents and isinstance(contents[0], Event):
        return [vocab.encode(EventCodec(vocab.config).fit(e) for e in contents)]
    words = tokenizer.get_vocab()
    return [tokenize(text, words, tokenizer.unk_token_id) for text in contents]


def _ids(path, contents, tokenizer, vocab: VocabMap) -> list[list[int]]:
    try:
        return to_ids(contents, tokenizer, vocab)
    except EventEncodeError as err:  # a recorded field out of the format's range (e.g. vk 300)
        raise InputError(f"{path}: a recorded event the {vocab.config.format} format cannot write ({err})") from None


def evaluate(pred_path, target_path, mode: str = "exact", batch_size: int = 16, progress: bool = True,
             format: Optional[str] = None, pairing: str = "index", tolerance_ms: Union[float, tuple] = 100.0) -> dict:
    """``OWAEventMetrics(alignment="generation", pairing=, tolerance_ms=)`` over the paired sequences of two files,
    in ``format`` (guessed from the files' tokens when None, see `guess_format`; `FormatGuessWarning` when they
    cannot tell; the metric's undecodable-targets warning comes as `UndecodedTargetsWarning`); under time pairing
    each sequence's time origin is its first valid true event."""
    from tqdm.auto import tqdm

    (pred_contents, pred_tags), (target_contents, target_tags) = read_tagged(pred_path), read_tagged(target_path)
    if format is None:
        format = guess_format(target_contents, pred_contents)
        if format is None:
            warnings.warn(FormatGuessWarning(target_path), stacklevel=2)
            format = "hierarchical"
    told = {path: told_format(contents) for path, contents in ((pred_path, pred_contents),
                                                               (target_path, target_contents))}
    if None not in told.values() and len(set(told.values())) > 1:  # (a format named against both: undecoded targets)
        warnings.warn(FormatMismatchWarning(told, format), stacklevel=2)
    tokenizer = build_tokenizer(format=format)
    vocab = VocabMap.from_tokenizer(tokenizer)
    preds, targets = (_ids(path, contents, tokenizer, vocab)
                      for path, contents in ((pred_path, pred_contents), (target_path, target_contents)))
    if len(preds) != len(targets):
        raise ValueError(f"{pred_path} has {len(preds)} sequences but {target_path} has {len(targets)}")
    tags = _tags((pred_path, pred_tags), (target_path, target_tags))
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", mode=mode, pairing=pairing, tolerance_ms=tolerance_ms,
                             tags=sorted(set(tags)) if tags else None)
    for first in tqdm(range(0, len(targets), batch_size), desc="evaluate", unit="batch", disable=not progress):
        metric.update(_pad(preds[first:first + batch_size]), _pad(targets[first:first + batch_size]),
                      tags=tags[first:first + batch_size] if tags else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = {k: float(v) for k, v in metric.compute().items()}
    for caught_warning in caught:
        if isinstance(caught_warning.message, InvalidTargetsWarning):
            warnings.warn(UndecodedTargetsWarning(target_path, int(report["status/invalid_target"]),
                                                  int(report["count/target_events"]), caught_warning.message.reason,
                                                  format), stacklevel=2)
        else:
            warnings.warn_explicit(caught_warning.message, caught_warning.category, caught_warning.filename,
                                   caught_warning.lineno)
    return report


def _tags(*files: tuple) -> Optional[list[str]]:
    """Each sequence's tag: from the files (path, tags) that have tags, which must then agree and tag every line."""
    tagged = [(path, tags) for path, tags in files if tags is not None]
    for path, tags in tagged:
        if None in tags:
            raise InputError(f"{path}:{tags.index(None) + 1}: no 'tag', while other lines have one: tag every "
                             "sequence or none")
    if len(tagged) == 2 and tagged[0][1] != tagged[1][1]:
        k = next(k for k, (a, b) in enumerate(zip(tagged[0][1], tagged[1][1])) if a != b)
        raise InputError(f"{tagged[0][0]}:{k + 1} is tagged {tagged[0][1][k]!r} but {tagged[1][0]}:{k + 1} "
                         f"{tagged[1][1][k]!r}: tag one file, or both alike")
    return tagged[0][1] if tagged else None


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(max(map(len, rows)), 1)
    return torch.tensor([row + [-100] * (width - len(row)) for row in rows], dtype=torch.long)


def write_sequences(path: str | Path, sequences, tokenizer, tags: Optional[list[str]] = None) -> Path:
    """Write token-id sequences as the file `evaluate` (``owa-metrics evaluate``) reads: ``.jsonl`` (one
    ``{"text": ...}`` a line, with ``"tag"`` when ``tags`` names each row's) or any other suffix (one line each).
    ``sequences``: a [B, T] tensor or lists of ids, e.g. ``model.generate(...)[:, prompt_len:]`` (the generated
    continuations) and the true continuations' ids; each id is written as the tokenizer names it
    (``convert_ids_to_tokens``), joined without separators, so every event token reads back as itself; ids < 0
    (ignored labels) and the pad id are left out, and so is everything from the first eos id on."""
    path = Path(path)
    rows = sequences.tolist() if isinstance(sequences, torch.Tensor) else [list(map(int, row)) for row in sequences]
    if tags is not None and len(tags) != len(rows):
        raise ValueError(f"write_sequences: {len(tags)} tags for {len(rows)} sequences: give one tag per sequence")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    lines = []
    for k, row in enumerate(rows):
        if eos is not None and eos != pad and eos in row:
            row = row[:row.index(eos)]
        text = "".join(tokenizer.convert_ids_to_tokens([i for i in row if i >= 0 and i != pad]))
        if "\n" in text or "\r" in text:
            raise ValueError(f"write_sequences: sequence {k} holds a line break token; the file holds one per line")
        lines.append(json.dumps({"text": text, **({"tag": tags[k]} if tags is not None else {})})
                     if path.suffix == ".jsonl" else text)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
