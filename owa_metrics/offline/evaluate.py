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
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ..schema import Event
from ..metrics.arguments import MAX_TAGS
from ..metrics.collection import OWAEventMetrics
from ..metrics.shared_compute import InvalidTargetsWarning
from ..tokens.codec import FORMATS, CodecConfig, EventCodec, EventEncodeError, possible_formats
from ..tokens.vocab import (IMAGE_CONVENTIONS, SPECIAL_TOKENS, VocabMap, build_tokenizer,
                            image_tokens as read_image_tokens)
from . import streaming
from .streaming import _PIECES, InputError, InputLines, TokenTable, exchange, raise_first, rank_world, tokenize


MCAP_MAGIC = b"\x89MCAP0\r\n"
UNKNOWN = SPECIAL_TOKENS["unk_token"]  # what `write_sequences` writes for an id the tokenizer has no token for


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
    file ``path``, ``count`` of ``total`` events, their most frequent failure ``reason`` and the ``format`` read;
    ``image_tokens``: tokens that the target's screen events hold where their image should be and that the
    vocabulary read lacks (then the fix is the image tokens, not the format), ``vlm`` the known VLM that writes them."""

    def __init__(self, path, count: int, total: int, reason: str, format: str, image_tokens: tuple = ()):
        self.path, self.count, self.total, self.reason, self.format = path, count, total, reason, format
        self.image_tokens = tuple(image_tokens)
        self.vlm = next((name for name, (_, token, _, _) in IMAGE_CONVENTIONS.items() if token in self.image_tokens),
                        None)
        fix = (f"its screens hold image tokens this vocabulary lacks ({', '.join(self.image_tokens[:3])}): pass "
               f"image_tokens={self.vlm or 'PREFIX IMAGE x COUNT SUFFIX'!r}" if self.image_tokens else
               f"files in another format: pass format={' | '.join(map(repr, FORMATS))}")
        super().__init__(f"{path}: {count} of {total} true events ({count / total:.0%}) do not decode in the {format} "
                         f"format (most often: {reason}) and are left out of every rate; {fix}")


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
            line, tag = streaming.json_line(line, path, number)
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
    from ..events import read_recording

    try:
        return read_recording(path)
    except ImportError as err:  # the optional extra is missing: still an ImportError, naming the file
        raise ImportError(f"{path}: {err}") from err
    except Exception as err:  # noqa: BLE001 - the reader's own errors say little: name the file
        raise InputError(f"{path}: unreadable MCAP recording ({type(err).__name__}: {err})") from None


def evaluation_warnings(report: dict, pred_path, target_path, generated_screens: str = "context") -> list[str]:
    """What a person must know before trusting the numbers, besides `evaluate`'s warnings: a target without events,
    a prediction of which no event decodes."""
    out = []
    decoded = report.get("status/valid", 0) + report.get("status/type_mismatch", 0)
    if report.get("count/target_events", 0) == 0:
        context = ("; screens are context, left out (--generated-screens scored scores them)"
                   if generated_screens == "context" else "")
        out.append(f"{target_path}: no true event (no <EVENT_START> ... <EVENT_END> span){context}")
    elif report.get("count/valid_target_events", 0) and decoded == 0:
        out.append(f"{pred_path}: no predicted event decodes ({int(report.get('count/pred_events', 0))} event spans "
                   "found): every true event counts as missing or invalid")
    return out


def told_format(content: list[str] | list[Event]) -> Optional[str]:
    """The one registered format that can have written the event tokens of ``content``'s texts (`possible_formats`),
    else None (no text, screens only, or tokens of no format)."""
    return _told(_held(content))


def _told(held: set[str]) -> Optional[str]:
    """`told_format` of a set of ``<...>`` tokens."""
    found = possible_formats(held)
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
    helds = []
    for content in contents:
        helds.append(_held(content))
    return format_of(*helds)


def format_of(*helds: set[str]) -> Optional[str]:
    """`guess_format` from each file's set of ``<...>`` tokens."""
    starts = {spec.preset.event_start for spec in FORMATS.values()}
    for held in helds:
        found = possible_formats(held)
        if len(found) == 1:
            return found[0]
    return None if any(held & starts for held in helds) else "hierarchical"


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


def evaluate(pred_path, target_path, mode: str = "exact", batch_size: int = 16, progress: Optional[bool] = None,
             format: Optional[str] = None, pairing: str = "index", tolerance_ms: Union[None, float, tuple] = None,
             generated_screens: str = "context", image_tokens: Optional[str] = None) -> dict:
    """``OWAEventMetrics(alignment="generation", pairing=, tolerance_ms=, generated_screens=)`` over the paired
    sequences of two files, in ``format`` (guessed from the files' tokens when None, see `guess_format`;
    `FormatGuessWarning` when they cannot tell; the metric's undecodable-targets warning comes as
    `UndecodedTargetsWarning`); under time pairing each sequence's time origin is its first valid true event.
    ``image_tokens``: the model's image tokens, a VLM's name or ``"PREFIX IMAGE x COUNT SUFFIX"``
    (`owa_metrics.tokens.vocab.image_tokens`); by default SmolVLM's and the screen placeholder. Two text files are
    streamed (`streaming`: memory flat in their size); under torch.distributed each rank takes its share
    of the sequences, and the report (every rank's: call on every rank) is one process's. ``progress``: a bar on
    stderr (None: when it is a terminal)."""
    from tqdm.auto import tqdm

    if ".mcap" not in (Path(pred_path).suffix, Path(target_path).suffix):
        return evaluate_text(pred_path, target_path, mode, progress, format, pairing, tolerance_ms,
                             generated_screens, image_tokens)
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
    tokenizer, vocab = _vocab(format, image_tokens)
    preds, targets = (_ids(path, contents, tokenizer, vocab)
                      for path, contents in ((pred_path, pred_contents), (target_path, target_contents)))
    if len(preds) != len(targets):
        raise ValueError(f"{pred_path} has {len(preds)} sequences but {target_path} has {len(targets)}")
    tags = _tags((pred_path, pred_tags), (target_path, target_tags))
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", mode=mode, pairing=pairing, tolerance_ms=tolerance_ms,
                             tags=sorted(set(tags)) if tags else None, generated_screens=generated_screens)
    rank, world = rank_world()
    for first in tqdm(range(rank * batch_size, len(targets), batch_size * world), desc="evaluate", unit="batch",
                      disable=None if progress is None else not progress):
        try:
            metric.update(_pad(preds[first:first + batch_size]), _pad(targets[first:first + batch_size]),
                          tags=tags[first:first + batch_size] if tags else None)
        except ValueError as err:  # a limit these sequences meet (e.g. events per update): name their lines
            last = min(first + batch_size, len(targets))
            lines = f":{first + 1}-{last}" if isinstance(target_contents[0], str) else ""
            raise InputError(f"{target_path}{lines} (and {pred_path}): {err}") from None
    return report_of(metric, target_path, format, lambda: screen_tokens_lacking(target_contents, tokenizer, vocab))


def _vocab(format: str, image_tokens: Optional[str]) -> tuple:
    """``(tokenizer, vocab)`` of ``format`` with the model's ``image_tokens`` (None: the defaults)."""
    config = None
    if image_tokens is not None:
        prefix, token, count, suffix = read_image_tokens(image_tokens)
        config = CodecConfig.preset(format, image_prefix=prefix, image_token=token, image_token_count=count,
                                    image_suffix=suffix)
    tokenizer = build_tokenizer(config, format=format)
    return tokenizer, VocabMap.from_tokenizer(tokenizer, config)


def report_of(metric: OWAEventMetrics, target_path, format: str, lacking: Callable[[], tuple] = tuple) -> dict:
    """``metric.compute()`` as floats (a sync under torch.distributed: call on every rank); its undecodable-targets
    warning as `UndecodedTargetsWarning` naming ``target_path`` (and ``lacking()``, called then: the image tokens its
    screens hold that the vocabulary lacks), the others as they come."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = {k: float(v) for k, v in metric.compute().items()}
    for caught_warning in caught:
        if isinstance(caught_warning.message, InvalidTargetsWarning):
            warnings.warn(UndecodedTargetsWarning(target_path, int(report["status/invalid_target"]),
                                                  int(report["count/target_events"]), caught_warning.message.reason,
                                                  format, lacking()), stacklevel=2)
        else:
            warnings.warn_explicit(caught_warning.message, caught_warning.category, caught_warning.filename,
                                   caught_warning.lineno)
    return report


def screen_tokens_lacking(contents: list[str] | list[Event], tokenizer, vocab: VocabMap) -> tuple[str, ...]:
    """The tokens that the texts' screen events hold between ``<SCREEN>`` and ``<EVENT_END>`` and that the tokenizer
    lacks (another VLM's image tokens, most likely), in order of first appearance."""
    c, words = vocab.config, tokenizer.get_vocab()
    screens = re.compile(re.escape(c.screen_token) + "(.*?)" + re.escape(c.event_end))
    found = {piece: None for text in contents if isinstance(text, str) for data in screens.findall(text)
             for piece in _PIECES.split(data) if piece.startswith("<") and piece.endswith(">") and piece not in words}
    return tuple(found)


def _tags(*files: tuple) -> Optional[list[str]]:
    """Each sequence's tag: from the files (path, tags) that have tags, which must then agree, tag every line and
    hold at most `MAX_TAGS` distinct tags."""
    tags = streaming.row_tags([path for path, _ in files], [tags for _, tags in files],
                              tuple(tags is not None for _, tags in files), 0)
    if tags is None:
        return None
    path = next(path for path, file_tags in files if file_tags is not None)
    first = {}  # each tag's first line
    for number, tag in enumerate(tags, 1):
        first.setdefault(tag, number)
    if len(first) > MAX_TAGS:
        name, number = list(first.items())[MAX_TAGS]
        raise InputError(f"{path}:{number}: {len(first)} distinct tags, at most {MAX_TAGS} (the tag {name!r} here is "
                         f"the {MAX_TAGS + 1}th; each tag keeps a copy of every state): group rare tags into one (e.g. "
                         "'other') or tag by a coarser label")
    return tags


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(max(map(len, rows)), 1)
    return torch.tensor([row + [-100] * (width - len(row)) for row in rows], dtype=torch.long)


def evaluate_text(pred_path, target_path, mode: str = "exact", progress: Optional[bool] = None,
                  format: Optional[str] = None, pairing: str = "index", tolerance_ms: Union[None, float, tuple] = None,
                  generated_screens: str = "context", image_tokens: Optional[str] = None) -> dict:
    """`evaluate` for two text / JSONL files, streamed and sharded (see the module)."""
    pred_path, target_path = Path(pred_path), Path(target_path)
    indexes, tags = streaming.line_indexes((pred_path, target_path))  # each rank scans a share of the blocks
    error = None
    try:
        if indexes[0].lines != indexes[1].lines:  # what is wrong with either file first, as when they pair
            for path, index in zip((pred_path, target_path), indexes):
                streaming.check_whole(path, index)
            raise ValueError(f"{pred_path} has {indexes[0].lines} sequences but {target_path} has {indexes[1].lines}")
    except (InputError, ValueError) as err:
        error = err
    raise_first(error)
    for path, found in zip((pred_path, target_path), tags):
        if len(found) > MAX_TAGS:
            name, line = sorted(found.items(), key=lambda item: item[1])[MAX_TAGS]
            raise InputError(f"{path}:{line + 1}: {len(found)} distinct tags, at most {MAX_TAGS} (the tag {name!r} "
                             f"here is the {MAX_TAGS + 1}th; each tag keeps a copy of every state): group rare tags "
                             "into one (e.g. 'other') or tag by a coarser label")
    tags = tuple(set(found) for found in tags)
    guess = format or guess_format(*(streaming.head_text(path) for path in (target_path, pred_path))) or "hierarchical"
    while True:
        report, helds, nonblank = _evaluate_lines(pred_path, target_path, indexes, tags, mode, progress, guess, pairing,
                                                  tolerance_ms, generated_screens, image_tokens)
        if format is not None:
            break
        told = format_of(helds[1], helds[0])
        if (told or "hierarchical") == guess:
            if told is None:
                warnings.warn(FormatGuessWarning(target_path), stacklevel=3)
            break
        guess = told or "hierarchical"  # the first block told another format than the whole files: once more
    told = {path: _told(held) for path, held in zip((pred_path, target_path), helds)}
    if None not in told.values() and len(set(told.values())) > 1:  # (a format named against both: undecoded targets)
        warnings.warn(FormatMismatchWarning(told, guess), stacklevel=2)
    for path, any_line in zip((pred_path, target_path), nonblank):
        if not any_line:
            raise InputError(f"{path}: no sequences (the file is empty or blank)")
    return report


def _evaluate_lines(pred_path: Path, target_path: Path, indexes: list, tags: tuple, mode: str,
                    progress: Optional[bool], format: str, pairing: str, tolerance_ms,
                    generated_screens: str = "context", image_tokens: Optional[str] = None):
    """The lines fed to the metric, a chunk at a time (`streaming.chunks`, each rank claiming the next: `Claims`),
    then the report (a sync); each file's held tokens and whether any line holds a sequence, over all ranks."""
    from tqdm.auto import tqdm

    tokenizer, vocab = _vocab(format, image_tokens)
    table = TokenTable(tokenizer.get_vocab(), tokenizer.unk_token_id)
    rank, world = rank_world()
    names = sorted(tags[0] | tags[1])
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", mode=mode, pairing=pairing, tolerance_ms=tolerance_ms,
                             tags=names or None, generated_screens=generated_screens)
    paths, spans = (pred_path, target_path), streaming.chunks(indexes[1], world)
    readers = [InputLines(path, table, 0, 0, 0) for path in paths]
    error, at = None, 0
    with tqdm(total=sum(index.size for index in indexes), unit="B", unit_scale=True, desc=target_path.name,
              file=sys.stderr, leave=False, disable=(None if progress is None else not progress) if rank == 0 else True
              ) as bar:  # rank 0's: the bytes before its chunk (every chunk before it is claimed) and its reads there
        try:
            for chunk in streaming.Claims(len(spans)):
                line, last = spans[chunk]
                at = line
                for reader, index in zip(readers, indexes):
                    stop = index.offset_of(last) if last < index.lines else None  # (None: to the file's end)
                    reader.seek(line, last, index.offset_of(line), stop)
                while line < last:
                    (p_ids, p_counts, p_tags), (t_ids, t_counts, t_tags) = streaming.window(readers, last - line)
                    k = len(t_counts)
                    row_tags = streaming.row_tags(paths, (p_tags, t_tags), tags, line)
                    for rows in streaming.batches(p_counts, t_counts):
                        try:
                            metric.update(streaming.padded(p_ids, p_counts, rows),
                                          streaming.padded(t_ids, t_counts, rows),
                                          tags=[row_tags[i] for i in rows.tolist()] if row_tags else None)
                        except ValueError as err:  # a limit these sequences meet (e.g. events per update): their lines
                            raise InputError(f"{target_path}:{line + 1}-{line + k} (and {pred_path}): {err}") from None
                    line += k
                    bar.update(sum(r.offset for r in readers) - bar.n)
        except (InputError, ValueError) as err:
            error = err
    raise_first(error, at)
    helds = [set().union(*held) for held in zip(*exchange([r.held() for r in readers]))]
    nonblank = [any(flags) for flags in zip(*exchange([r.nonblank for r in readers]))]
    if not all(nonblank):
        return None, helds, nonblank
    def lacking() -> tuple:  # (read in the target's first block)
        return screen_tokens_lacking(streaming.head_text(target_path), tokenizer, vocab)

    return report_of(metric, target_path, format, lacking), helds, nonblank


def write_sequences(path: str | Path, sequences, tokenizer, tags: Optional[list[str]] = None) -> Path:
    """Write token-id sequences as the file `evaluate` (``owa-metrics evaluate``) reads: ``.jsonl`` (one
    ``{"text": ...}`` a line, with ``"tag"`` when ``tags`` names each row's) or any other suffix (one line each).
    ``sequences``: a [B, T] tensor or lists of ids, e.g. ``model.generate(...)[:, prompt_len:]`` (the generated
    continuations) and the true continuations' ids; each id is written as the tokenizer names it
    (``convert_ids_to_tokens``), joined without separators, so every event token reads back as itself; ids < 0
    (ignored labels) and the pad id are left out, and so is everything from the first eos id on. An id the tokenizer
    has no token for (a model whose embedding is larger than its tokenizer can generate one) is written as
    ``<unk>``, the unknown token `evaluate` reads: inside an event the event does not decode (the model's error,
    counted like any malformed event), between events it is text and ignored."""
    path = Path(path)
    rows = sequences.tolist() if isinstance(sequences, torch.Tensor) else [list(map(int, row)) for row in sequences]
    if tags is not None and len(tags) != len(rows):
        raise ValueError(f"write_sequences: {len(tags)} tags for {len(rows)} sequences: give one tag per sequence")
    pad, eos, size = tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer)
    lines = []
    for k, row in enumerate(rows):
        if eos is not None and eos != pad and eos in row:
            row = row[:row.index(eos)]
        kept = [i for i in row if i >= 0 and i != pad]
        named = tokenizer.convert_ids_to_tokens([i for i in kept if i < size])[::-1]
        text = "".join(UNKNOWN if i >= size else named.pop() or UNKNOWN for i in kept)
        if "\n" in text or "\r" in text:
            raise ValueError(f"write_sequences: sequence {k} holds a line break token; the file holds one per line")
        lines.append(json.dumps({"text": text, **({"tag": tags[k]} if tags is not None else {})})
                     if path.suffix == ".jsonl" else text)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
