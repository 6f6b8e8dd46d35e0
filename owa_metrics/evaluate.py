"""Offline evaluation: predicted vs true event sequences from files, one report.

A file is an OWA MCAP recording (one sequence: the whole recording), or text / JSONL with one sequence of
event tokens per line (JSONL: a JSON string, or an object with a "text" field). The k-th predicted sequence
is compared with the k-th true one, event by event (generation alignment; events paired by index, or by time
with ``pairing="time"``). The token format is the target
file's (`guess_format`) unless one is named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import torch

from .events.event import Event
from .metrics.collection import OWAEventMetrics
from .tokens.codec import EventCodec
from .tokens.vocab import VocabMap, build_tokenizer


MCAP_MAGIC = b"\x89MCAP0\r\n"


class InputError(ValueError):
    """A file the evaluator cannot read; the message names the file and says what is wrong with it."""


def read_file(path: str | Path) -> list[str] | list[Event]:
    """A file's token texts (one per sequence), or an MCAP recording's events (see the module docstring); raises
    `InputError` saying what is wrong with the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
    if path.suffix == ".mcap":
        return _read_mcap(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                         "expected one token sequence per line, or an OWA .mcap recording") from None
    texts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number}: not JSON ({err.msg})") from None
            line = item["text"] if isinstance(item, dict) and "text" in item else item
            if not isinstance(line, str):
                raise InputError(f"{path}:{number}: expected a string or an object with a 'text' field")
        texts.append(line.strip())
    if not texts:
        raise InputError(f"{path}: no sequences (the file is empty or blank)")
    return texts


def _read_mcap(path: Path, data: bytes) -> list[Event]:
    if not data.startswith(MCAP_MAGIC):
        raise InputError(f"{path}: not an MCAP file (it does not start with the MCAP magic bytes)")
    if len(data) < 2 * len(MCAP_MAGIC) or not data.endswith(MCAP_MAGIC):
        raise InputError(f"{path}: MCAP file truncated at byte {len(data)} (no closing magic bytes)")
    from .events import read_recording

    try:
        return read_recording(path)
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 - the reader's own errors say little: name the file
        raise InputError(f"{path}: unreadable MCAP recording ({type(err).__name__}: {err})") from None


def evaluation_warnings(report: dict, pred_path, target_path) -> list[str]:
    """What a person must know before trusting the numbers: a side of which no event decodes."""
    out = []
    decoded = report.get("status/valid", 0) + report.get("status/type_mismatch", 0)
    if report.get("count/valid_target_events", 0) == 0:
        out.append(f"{target_path}: no true event decodes ({int(report.get('count/target_events', 0))} found)")
    elif decoded == 0:
        out.append(f"{pred_path}: no predicted event decodes ({int(report.get('count/pred_events', 0))} event spans "
                   "found): every true event counts as missing or invalid")
    return out


_PIECES = re.compile(r"(<[^<>]*>)")
_FACTORIZED_ONLY = re.compile(r"<SIGN_PLUS>|<SIGN_MINUS>|<VK_\d+>|<MB_\d+>")


def guess_format(contents: list[str] | list[Event]) -> str:
    """Texts holding a factorized-only token (``<SIGN_PLUS>``, ``<VK_n>``, ``<MB_h>`` ...) are factorized; the rest,
    and recordings, hierarchical."""
    texts = [c for c in contents if isinstance(c, str)]
    return "factorized" if any(_FACTORIZED_ONLY.search(text) for text in texts) else "hierarchical"


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


def evaluate(pred_path, target_path, mode: str = "exact", batch_size: int = 16, progress: bool = True,
             format: Optional[str] = None, pairing: str = "index", tolerance_ms: float = 100.0) -> dict:
    """``OWAEventMetrics(alignment="generation", pairing=, tolerance_ms=)`` over the paired sequences of two files,
    in ``format`` (guessed from the target file's tokens when None, see `guess_format`); under time pairing each
    sequence's time origin is its first valid true event."""
    from tqdm.auto import tqdm

    pred_contents, target_contents = read_file(pred_path), read_file(target_path)
    tokenizer = build_tokenizer(format=format or guess_format(target_contents))
    metric = OWAEventMetrics(tokenizer, alignment="generation", mode=mode, pairing=pairing, tolerance_ms=tolerance_ms)
    preds, targets = to_ids(pred_contents, tokenizer, metric.vocab), to_ids(target_contents, tokenizer, metric.vocab)
    if len(preds) != len(targets):
        raise ValueError(f"{pred_path} has {len(preds)} sequences but {target_path} has {len(targets)}")
    for first in tqdm(range(0, len(targets), batch_size), desc="evaluate", unit="batch", disable=not progress):
        metric.update(_pad(preds[first:first + batch_size]), _pad(targets[first:first + batch_size]))
    return {k: float(v) for k, v in metric.compute().items()}


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(max(map(len, rows)), 1)
    return torch.tensor([row + [-100] * (width - len(row)) for row in rows], dtype=torch.long)
