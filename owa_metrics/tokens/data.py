"""Events to model inputs: token-id sequences with their labels, and their batches (the first stage of the flow,
what a training run feeds the model and the metrics read back)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .vocab import VocabMap

SEQUENCE_KEYS = ("input_ids", "labels", "attention_mask")


def token_sequences(vocab: VocabMap, events, max_tokens: int) -> list[dict[str, torch.Tensor]]:
    """``events`` packed whole into sequences of at most ``max_tokens`` ids (`VocabMap.encode_sequences`), as
    ``{"input_ids", "labels"}`` items: the labels are the ids with the image tokens as -100 (never scored)."""
    ids = vocab.encode_sequences(events, max_tokens)
    labels = vocab.encode_sequences(events, max_tokens, ignore_images=True)
    return [{"input_ids": torch.tensor(i), "labels": torch.tensor(lab)} for i, lab in zip(ids, labels)]


def collate(items: Sequence[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch of ``{"input_ids", "labels"[, "attention_mask"], ...}`` items, right-padded to the longest: ids with
    ``pad_id``, labels with -100, the attention mask 1 over each item's own length (or its ``attention_mask``),
    never read from the ids (a tokenizer's id 0 is often a real token). Any other tensor (``pixel_values``: one
    entry per image) is concatenated along its first dimension, in item order, as HF VLMs take it; numbers (a tag id)
    make a [B] tensor, strings (a tag name) a list."""
    width = max(len(x["input_ids"]) for x in items)
    pad = lambda key, value: torch.stack(  # noqa: E731
        [torch.nn.functional.pad(torch.as_tensor(x[key]), (0, width - len(x[key])), value=value) for x in items])
    masks = [torch.as_tensor(x["attention_mask"]) if "attention_mask" in x else torch.ones(len(x["input_ids"]),
                                                                                          dtype=torch.long) for x in items]
    batch = {"input_ids": pad("input_ids", pad_id),
             "attention_mask": torch.stack([torch.nn.functional.pad(m, (0, width - len(m))) for m in masks])}
    if "labels" in items[0]:
        batch["labels"] = pad("labels", -100)
    for key in [k for k in items[0] if k not in SEQUENCE_KEYS]:  # a string per item (a tag): their list
        batch[key] = [x[key] for x in items] if isinstance(items[0][key], str) else torch.cat(
            [torch.atleast_1d(torch.as_tensor(x[key])) for x in items])
    return batch
