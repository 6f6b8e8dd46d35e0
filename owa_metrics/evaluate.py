"""Offline evaluation: predicted vs true event sequences from files, one report.

A file is an OWA MCAP recording (one sequence: the whole recording), or text / JSONL with one sequence of
event tokens per line (JSONL: a JSON string, or an object with a "text" field). The k-th predicted sequence
is compared with the k-th true one, event by event (generation alignment).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .metrics.collection import OWAEventMetrics
from .tokens.vocab import VocabMap, build_tokenizer


def read_sequences(path: str | Path, tokenizer, vocab: VocabMap) -> list[list[int]]:
    """Token-id sequences of a file (see the module docstring); raises ValueError / OSError saying why not."""
    path = Path(path)
    if path.suffix == ".mcap":
        from .events import read_recording

        return [vocab.encode(read_recording(path))]
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
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def evaluate(pred_path, target_path, mode: str = "exact", batch_size: int = 16, progress: bool = True) -> dict:
    """``OWAEventMetrics(alignment="generation")`` over the paired sequences of two files."""
    from tqdm.auto import tqdm

    tokenizer = build_tokenizer()
    metric = OWAEventMetrics(tokenizer, alignment="generation", mode=mode)
    preds = read_sequences(pred_path, tokenizer, metric.vocab)
    targets = read_sequences(target_path, tokenizer, metric.vocab)
    if len(preds) != len(targets):
        raise ValueError(f"{pred_path} has {len(preds)} sequences but {target_path} has {len(targets)}")
    for first in tqdm(range(0, len(targets), batch_size), desc="evaluate", unit="batch", disable=not progress):
        metric.update(_pad(preds[first:first + batch_size]), _pad(targets[first:first + batch_size]))
    return {k: float(v) for k, v in metric.compute().items()}


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(max(map(len, rows)), 1)
    return torch.tensor([row + [-100] * (width - len(row)) for row in rows], dtype=torch.long)
