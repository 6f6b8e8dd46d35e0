"""Token-level statistics of the events of a batch: which field each target token belongs to, and its loss."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..decode.batch import EventBatch
from ..events.event import Kind, Status
from ..tokens.codec import CodecConfig

TOKEN_FIELDS = ("timestamp", "mouse_delta", "button_flags", "vk")


def field_table(config: CodecConfig, device=None) -> torch.Tensor:
    """[3 kinds, width + 1]: the `TOKEN_FIELDS` index of each slot of an event (-1: none), slot 0 = start."""
    n_ts, n_d, n_f = len(config.timestamp_bases), 2 * len(config.mouse_delta_bases), len(config.button_flag_bases)
    width = 2 + n_ts + n_d + n_f + len(config.scroll_bases) + 2
    table = torch.full((3, width + 1), -1, dtype=torch.int64)
    table[:, 2:2 + n_ts] = TOKEN_FIELDS.index("timestamp")
    table[int(Kind.KEYBOARD), 2 + n_ts] = TOKEN_FIELDS.index("vk")
    table[int(Kind.MOUSE), 2 + n_ts:2 + n_ts + n_d] = TOKEN_FIELDS.index("mouse_delta")
    table[int(Kind.MOUSE), 2 + n_ts + n_d:2 + n_ts + n_d + n_f] = TOKEN_FIELDS.index("button_flags")
    return table.to(device)


class EventTokenStats(NamedTuple):
    """Per target event (valid targets, in row order): category and summed token loss; per field: tokens
    predicted right and tokens in all."""

    category: torch.Tensor
    loss_sum: Optional[torch.Tensor]
    field_correct: torch.Tensor
    field_total: torch.Tensor


def event_token_stats(batch: EventBatch, preds: torch.Tensor, target: torch.Tensor, config: CodecConfig,
                      logits: Optional[torch.Tensor] = None) -> EventTokenStats:
    """Teacher forcing: expand every valid target event to its token positions (vectorized), then count
    per field the tokens predicted right and, given ``logits`` [B, T, V] aligned with ``target``, sum each
    event's token cross-entropy (ignored labels excluded)."""
    B, T = target.shape
    rows = (batch.target.status == int(Status.VALID)).nonzero().squeeze(1)
    start, end = batch.target.start[rows], batch.target.end[rows]
    lengths = end - start + 1
    row_of = torch.repeat_interleave(torch.arange(rows.numel(), device=target.device), lengths)
    offset = torch.arange(row_of.numel(), device=target.device) - (torch.cumsum(lengths, 0) - lengths)[row_of]
    pos = batch.seq_idx[rows][row_of] * T + start[row_of] + offset
    table = field_table(config, target.device)
    slot = (offset + batch.target.start_cut[rows][row_of].long()).clamp(max=table.shape[1] - 1)
    field = table[batch.target.kind[rows][row_of], slot]
    labels, guesses = target.reshape(-1)[pos], preds.reshape(-1)[pos]
    counted = (field >= 0) & (labels >= 0)
    bins = field.clamp(min=0)
    field_total = torch.bincount(bins, weights=counted.double(), minlength=len(TOKEN_FIELDS))
    field_correct = torch.bincount(bins, weights=(counted & (guesses == labels)).double(), minlength=len(TOKEN_FIELDS))
    loss_sum = None
    if logits is not None:
        scored = labels >= 0
        token_loss = torch.nn.functional.cross_entropy(
            logits.reshape(B * T, -1)[pos[scored]].float(), labels[scored], reduction="none")
        loss_sum = torch.zeros(rows.numel(), dtype=torch.float64, device=target.device)
        loss_sum.index_add_(0, row_of[scored], token_loss.double())
    return EventTokenStats(batch.target.category[rows], loss_sum, field_correct, field_total)
