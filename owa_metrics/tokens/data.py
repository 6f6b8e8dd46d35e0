"""Events to model inputs: token-id sequences with their labels, and their batches (the first stage of the flow,
what a training run feeds the model and the metrics read back)."""

from __future__ import annotations

import functools
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
    never read from the ids (a tokenizer's id 0 is often a real token). The other keys keep the layout their VLM's
    processor gives a batch: a tensor shaped like the item's ids (``mm_token_type_ids``) is right-padded with 0
    to [B, width]; with ``pixel_attention_mask`` in the items, or 5-D ``pixel_values`` (Idefics3 / SmolVLM:
    [1, images, 3, H, W] or [images, 3, H, W] an item), both are zero-padded to the most images and stacked,
    [B, max images, ...]; any other tensor (``pixel_values`` with one entry per image, or Qwen2-VL's patches,
    ``image_grid_thw``) is concatenated along its first dimension, in item order, in the dtype of the items that
    hold some (an item without screens may give an empty float tensor: it does not count). Numbers (a tag id) make a [B]
    tensor, strings (a tag name) a list."""
    width = max(len(x["input_ids"]) for x in items)
    pad = lambda key, value: torch.stack(  # noqa: E731
        [torch.nn.functional.pad(torch.as_tensor(x[key]), (0, width - len(x[key])), value=value) for x in items])
    masks = [torch.as_tensor(x["attention_mask"]) if "attention_mask" in x else torch.ones(len(x["input_ids"]),
                                                                                          dtype=torch.long) for x in items]
    batch = {"input_ids": pad("input_ids", pad_id),
             "attention_mask": torch.stack([torch.nn.functional.pad(m, (0, width - len(m))) for m in masks])}
    if "labels" in items[0]:
        batch["labels"] = pad("labels", -100)
    first = {k: torch.as_tensor(v) for k, v in items[0].items() if not isinstance(v, str)}
    per_row = {"pixel_attention_mask": 2} if "pixel_attention_mask" in first or (
        "pixel_values" in first and first["pixel_values"].dim() == 5) else {}  # key: its dims after the image's
    per_row.update({"pixel_values": 3} if per_row else {})
    for key in [k for k in items[0] if k not in SEQUENCE_KEYS]:  # a string per item (a tag): their list
        if isinstance(items[0][key], str):
            batch[key] = [x[key] for x in items]
        elif first[key].shape == torch.as_tensor(items[0]["input_ids"]).shape:  # per token
            batch[key] = pad(key, 0)
        elif key in per_row:  # per row: [images, ...] each, zero-padded to the most
            rows = [torch.as_tensor(x[key]).reshape(-1, *first[key].shape[-per_row[key]:]) for x in items]
            most = max(len(r) for r in rows)
            batch[key] = torch.stack([torch.cat([r, r.new_zeros(most - len(r), *r.shape[1:])]) for r in rows])
        else:  # an item without images (an empty tensor, float when built from []) takes no part in the dtype
            parts = [torch.atleast_1d(torch.as_tensor(x[key])) for x in items]
            dtype = functools.reduce(torch.promote_types, [p.dtype for p in parts if p.numel()] or [parts[0].dtype])
            batch[key] = torch.cat([p.to(dtype) for p in parts])
    return batch
