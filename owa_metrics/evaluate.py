"""Offline evaluation: predicted vs true event sequences from files, one report.

A file is an OWA MCAP recording (one sequence: the whole recording), or text / JSONL with one sequence of
event tokens per line (JSONL: a JSON string, or an object with a "text" field). The k-th predicted sequence
is compared with the k-th true one, event by event (generation alignment). The token format is the target
file's (`guess_format`) unless one is named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from .events.event import Event
from .metrics.collection import OWAEventMetrics
from .tokens.codec import CodecConfig, EventCodec, split_tokens
from .tokens.vocab import VocabMap, build_tokenizer


def read_file(path: str | Path) -> list[str] | list[Event]:
    """A file's token texts (one per sequence), or an MCAP recording's events (see the module docstring); raises
    ValueError / OSError saying why not."""
    path = Path(path)
    if path.suffix == ".mcap":
        from .events import read_recording

        return read_recording(path)
    texts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
            line = item["text"] if isinstance(item, dict) and "text" in item else item
            if not isinstance(line, str):
                raise ValueError(f"{path}:{number}: expected a string or an object with a 'text' field")
        texts.append(line.strip())
    if not texts:
        raise ValueError(f"{path}: no sequences")
    return texts


def guess_format(contents: list[str] | list[Event]) -> str:
    """Texts holding a factorized-only token (``<SIGN_PLUS>``, ``<VK_n>``, ``<MB_h>`` ...) are factorized; the rest,
    and recordings, hierarchical."""
    factorized = set(CodecConfig.preset("factorized").event_tokens) - set(CodecConfig().event_tokens)
    texts = [c for c in contents if isinstance(c, str)]
    return "factorized" if any(t in factorized for text in texts for t in split_tokens(text)) else "hierarchical"


def to_ids(contents: list[str] | list[Event], tokenizer, vocab: VocabMap) -> list[list[int]]:
    """Token ids: each text tokenized, or a recording's events encoded as one sequence."""
    if contents and isinstance(contents[0], Event):
        return [vocab.encode(EventCodec(vocab.config).fit(e) for e in contents)]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in contents]


def evaluate(pred_path, target_path, mode: str = "exact", batch_size: int = 16, progress: bool = True,
             format: Optional[str] = None) -> dict:
    """``OWAEventMetrics(alignment="generation")`` over the paired sequences of two files, in ``format`` (guessed
    from the target file's tokens when None, see `guess_format`)."""
    from tqdm.auto import tqdm

    pred_contents, target_contents = read_file(pred_path), read_file(target_path)
    tokenizer = build_tokenizer(format=format or guess_format(target_contents))
    metric = OWAEventMetrics(tokenizer, alignment="generation", mode=mode)
    preds, targets = to_ids(pred_contents, tokenizer, metric.vocab), to_ids(target_contents, tokenizer, metric.vocab)
    if len(preds) != len(targets):
        raise ValueError(f"{pred_path} has {len(preds)} sequences but {target_path} has {len(targets)}")
    for first in tqdm(range(0, len(targets), batch_size), desc="evaluate", unit="batch", disable=not progress):
        metric.update(_pad(preds[first:first + batch_size]), _pad(targets[first:first + batch_size]))
    return {k: float(v) for k, v in metric.compute().items()}


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(max(map(len, rows)), 1)
    return torch.tensor([row + [-100] * (width - len(row)) for row in rows], dtype=torch.long)
