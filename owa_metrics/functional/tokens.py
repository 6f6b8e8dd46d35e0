"""Token-level statistics of the events of a batch: which field each target token belongs to, and its loss."""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple, Optional

import torch

from ..decode.event_batch import EventBatch
from ..schema import CATEGORY_NAMES, Kind
from ..tokens.codec import CodecConfig
from .events import ratio

TOKEN_FIELDS = ("timestamp", "mouse_delta", "button_flags", "vk")
_TOKEN_FIELD_OF = {"timestamp": "timestamp", "dx": "mouse_delta", "dy": "mouse_delta", "button_flags": "button_flags",
                   "vk": "vk"}


@functools.lru_cache(maxsize=None)
def field_table(config: CodecConfig) -> torch.Tensor:
    """[3 kinds, width + 1]: the `TOKEN_FIELDS` index of each token of the kind's first layout (-1: none), slot 0 =
    ``<EVENT_START>``, read from the format's table (a sign token counts with its field's digits)."""
    fmt = config.token_format
    slots = [fmt.window_slots(kind) for kind in ("keyboard", "mouse", "screen")]
    width = max(len(s) for s in slots)
    table = torch.full((3, width + 1), -1, dtype=torch.int64)
    for k, names in enumerate(slots):
        for i, name in enumerate(names):
            if name in _TOKEN_FIELD_OF:
                table[k, i] = TOKEN_FIELDS.index(_TOKEN_FIELD_OF[name])
    return table


class EventTokenStats(NamedTuple):
    """Per target event (in row order): category (`Category.INVALID`: the target does not decode, left out of the
    sums) and summed token loss; per field: tokens predicted right and tokens in all."""

    category: torch.Tensor
    loss_sum: Optional[torch.Tensor]
    field_correct: torch.Tensor
    field_total: torch.Tensor
    loss_skipped: Optional[torch.Tensor] = None  # labelled tokens left out of the loss


def event_token_stats(batch: EventBatch, preds: torch.Tensor, target: torch.Tensor, config: CodecConfig,
                      logits: Optional[torch.Tensor] = None, token_loss: Optional[torch.Tensor] = None,
                      group: Optional[torch.Tensor] = None, groups: int = 1) -> EventTokenStats:
    """Teacher forcing: per field, the tokens predicted right among the valid target events' labelled field tokens
    (a [slot, event] window, as the decoder's), and, given ``logits`` [B, T, V] aligned with ``target``, each
    event's summed token cross-entropy over its whole span (ignored labels excluded), by cumulative sums; or from
    ``token_loss`` [B, T], that cross-entropy given per position (`given_token_losses`).
    Every row at once, the invalid targets masked: no host sync (but `token_losses`' on the CPU).

    Each window token gets a code: its field + F x (predicted wrong), negative where it counts for no field (past
    the span, an ignored label, a slot of no field, an invalid target); the number of tokens of each code in
    [0, 2F) is (right, wrong) per field, whose running sum is (right, total). ``group`` [B]: each sequence's group
    in [0, groups) (a tag): the field counts [groups, F] and the skipped tokens [groups] by group, in one count."""
    B, T = target.shape
    t = batch.target
    category = t.category
    first, last = torch.add(t.start, batch.seq_idx, alpha=T), torch.add(t.end, batch.seq_idx, alpha=T)
    # [slot, category] (`field_table` by the kinds' categories; -2F: no field), slots [W, 1], codes [2, F, 1, 1]
    fields_by_slot, slots, codes = _window_constants(config, target.device)
    pos = torch.add(first, t.start_cut, alpha=-1) + slots  # [slot, event], slot 0 = start
    wrong = torch.where(target < 0, -1, preds != target)  # per token: -1 ignored, 0 right, 1 wrong
    code = torch.add(fields_by_slot.index_select(1, category), wrong.take(pos.clamp(0, B * T - 1)), alpha=len(TOKEN_FIELDS))
    if group is None:
        counts = (torch.where(pos <= last, code, -1) == codes).sum((2, 3), dtype=torch.float64)  # (right, wrong) [2, F]
        field_correct, field_total = counts.cumsum(0)
    else:  # each counted code in its group's block of 2F (the last cell: counted for no field)
        cells = 2 * len(TOKEN_FIELDS)
        code = torch.where((pos <= last) & (code >= 0), code + group.index_select(0, batch.seq_idx) * cells, groups * cells)
        counts = torch.zeros(groups * cells + 1, dtype=torch.float64, device=code.device).index_add_(
            0, code.view(-1), torch.ones_like(code, dtype=torch.float64).view(-1))[:-1].view(groups, 2, -1)
        field_correct, field_total = counts.cumsum(1).unbind(1)
    loss_sum = skipped = None
    if logits is not None or token_loss is not None:
        by_row = group is not None
        token_loss, skipped = token_losses(logits, target, by_row=by_row) if logits is not None else \
            given_token_losses(token_loss, target, by_row=by_row)
        if by_row:
            skipped = skipped.new_zeros(groups).index_add_(0, group, skipped)
        cumulative = torch.nn.functional.pad(token_loss.cumsum(0), (1, 0))
        loss_sum = cumulative.index_select(0, last + 1) - cumulative.index_select(0, first)
    return EventTokenStats(category, loss_sum, field_correct, field_total, skipped)


@functools.lru_cache(maxsize=None)
def _window_constants(config: CodecConfig, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(fields [width, categories + 1], slots [width, 1], codes [2, F, 1, 1])`` of `event_token_stats`: the
    `field_table` column of each category's kind (-2F: no field; the last column, `Category.INVALID`, none);
    cached (no copy to a GPU per update)."""
    table = field_table(config)
    n_fields = len(TOKEN_FIELDS)
    kind_of_category = [int(Kind.KEYBOARD), int(Kind.MOUSE), int(Kind.MOUSE), int(Kind.SCREEN)]
    fields = torch.full((table.shape[1], len(CATEGORY_NAMES) + 1), -2 * n_fields, dtype=torch.int64)
    fields[:, :-1] = torch.where(table >= 0, table, -2 * n_fields).T[:, kind_of_category]
    return (fields.to(device), torch.arange(table.shape[1], device=device)[:, None],
            torch.arange(2 * n_fields, device=device).view(2, n_fields, 1, 1))


def token_losses(logits: torch.Tensor, target: torch.Tensor, chunk_rows: Optional[int] = None,
                 by_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_loss [B * T] float64, skipped)``: the cross-entropy ``logsumexp(z) - z[label]`` of each labelled
    position of ``target`` under ``logits`` [B, T, V] (0 elsewhere); a label past the logits' vocabulary or a
    non-finite loss (NaN / inf logits) is 0 and counted in ``skipped``. On the CPU (or given ``chunk_rows``) it is
    computed at the labelled positions only, in blocks of ``chunk_rows`` (default 2048: buffers of that size are
    reused rather than faulted in anew; fewer where the vocabulary is wide: `CPU_BLOCK_LOGITS`) as
    `block_cross_entropy`, no copy of the whole logits; finding them reads their number (a host sync, none on the
    CPU). Elsewhere at every position at once (`dense_token_losses`): no host sync."""
    if chunk_rows is None and target.device.type != "cpu":
        return dense_token_losses(logits, target, by_row=by_row)
    B, T = target.shape
    labels_flat = target.reshape(-1)
    scored = (labels_flat >= 0).nonzero().squeeze(1)
    rows = logits.reshape(-1, logits.shape[-1])  # [B * T, V]; [0, V] without positions (then none is labelled)
    vocab_size = rows.shape[-1]
    wanted = labels_flat.index_select(0, scored)
    chunk_rows = min(chunk_rows or 2048, max(1, CPU_BLOCK_LOGITS // max(1, vocab_size)))
    # the label's logit at each labelled position, read in place (label clamped into the vocabulary: masked below)
    label_logits = logits.take(torch.add(wanted.clamp(max=vocab_size - 1), scored, alpha=vocab_size))
    token_ce = torch.empty(scored.numel(), dtype=torch.float64, device=target.device)
    # a loop over blocks of positions, not over tokens, each written into its slice of the one output (a list of
    # blocks joined by cat let glibc return and fault in the block buffers anew: 50 MB of page faults per call at
    # 32 x 2048 in some runs); the log-sum-exp of a block in float32 (a float32 block goes as it is), minus the
    # labels' logits: as `block_cross_entropy`, with no log-softmax written out
    for at, label_logit, out in zip(*(x.split(chunk_rows) for x in (scored, label_logits, token_ce))):
        block = rows.index_select(0, at)
        torch.sub(torch.logsumexp(block if block.dtype == torch.float32 else block.float(), -1), label_logit, out=out)
    usable = (wanted < vocab_size) & torch.isfinite(token_ce)
    token_loss = torch.zeros(B * T, dtype=torch.float64, device=target.device)
    token_loss.index_copy_(0, scored, torch.where(usable, token_ce, 0.0))
    if by_row:  # skipped per row of target [B]
        return token_loss, torch.zeros(B, dtype=torch.float64, device=target.device).index_add_(
            0, torch.div(scored, max(T, 1), rounding_mode="floor"), (~usable).double())
    return token_loss, (~usable).sum(dtype=torch.float64)


def given_token_losses(token_loss: torch.Tensor, target: torch.Tensor, by_row: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_losses` from a per-token cross-entropy [B, T] aligned with ``target`` (a fused loss, or a loss with
    ``reduction="none"``): kept at the labelled positions, a non-finite one 0 and counted in ``skipped``."""
    labelled = target.reshape(-1) >= 0
    loss = token_loss.reshape(-1).to(torch.float64)
    usable = torch.isfinite(loss)
    skipped = labelled & ~usable
    return torch.where(labelled & usable, loss, 0.0), (skipped.view(target.shape[0], -1).sum(1, dtype=torch.float64)
                                                       if by_row else skipped.sum(dtype=torch.float64))


def per_token_loss(logits: torch.Tensor, target: torch.Tensor, block_logits: Optional[int] = None) -> torch.Tensor:
    """[B, T] float32, what ``update(token_loss=)`` takes: ``logsumexp(z) - z[label]`` at each labelled position of
    ``target`` under ``logits`` [B, T, V], 0 at ignored ones, NaN for a label past the vocabulary (then counted as
    skipped); in blocks of ``block_logits`` logits (`dense_token_losses`)."""
    labels, rows = target.reshape(-1), logits.reshape(-1, logits.shape[-1])
    if not labels.numel():
        return torch.zeros(target.shape, device=target.device)
    token_ce = torch.where(labels < rows.shape[-1], _blocked_cross_entropy(rows, labels, block_logits or
                                                                            LOSS_BLOCK_LOGITS), float("nan"))
    return torch.where(labels < 0, 0.0, token_ce).view(target.shape)


LOSS_BLOCK_LOGITS = 2**27  # logits per block of `dense_token_losses`: float32 buffers of 512 MB at most
CPU_BLOCK_LOGITS = 2**21  # logits per block of `token_losses` on the CPU: a float32 block of 8 MB at most


def block_cross_entropy(block: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """float32 [R]: ``logsumexp(z) - z[label]`` of each row ``z`` of ``block`` [R, V] (any float dtype, read as
    float32) at its label (in the vocabulary): the log-sum-exp and the label's logit, no log-softmax written out.
    On CUDA `_blocked_cross_entropy` runs it compiled (`fused_block_cross_entropy`)."""
    z = block.float()
    return torch.logsumexp(z, -1) - z.gather(-1, labels[:, None]).squeeze(-1)


_fused: dict = {}  # "fn": the compiled `block_cross_entropy`; "failed": why it could not run


def fused_block_cross_entropy(block: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`block_cross_entropy` through ``torch.compile`` (on CUDA: one Triton reduction per row that reads the block
    once in its own dtype, log-sum-exp and the label's logit in registers, no float32 copy of the block); where it
    cannot compile (no Triton, an unsupported platform), `block_cross_entropy` itself, with one warning."""
    if "failed" not in _fused:
        try:
            if "fn" not in _fused:
                _fused["fn"] = torch.compile(block_cross_entropy)
            return _fused["fn"](block, labels)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - any compile failure: the eager ops compute the same
            _fused["failed"] = err
            warnings.warn(f"owa_metrics: the fused token loss does not compile here ({type(err).__name__}: {err}); "
                          "the token loss runs as torch ops (a float32 copy of each block).", RuntimeWarning,
                          stacklevel=2)
    return block_cross_entropy(block, labels)


def dense_token_losses(logits: torch.Tensor, target: torch.Tensor,
                       block_logits: int = LOSS_BLOCK_LOGITS, by_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_losses` at every position (the ignored ones computed, then zeroed), in blocks of
    ``max(1, block_logits // V)`` positions: a number fixed by the shapes, so no host sync, and a float32 copy and
    log-softmax of one block at a time (V = 151,936 at 8 x 8192 positions: 75 blocks of 512 MB, not 40 GB each)."""
    labels = target.reshape(-1)
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.shape[0] != labels.numel():  # no positions: the labels are `_check_inputs`' ignored padding column
        zeros = torch.zeros(labels.numel() + 1, dtype=torch.float64, device=target.device)
        return zeros[:-1], zeros.new_zeros(target.shape[0]) if by_row else zeros[-1]
    token_ce = _blocked_cross_entropy(rows, labels, block_logits)
    usable = (labels < rows.shape[-1]) & torch.isfinite(token_ce)
    labelled = labels >= 0
    skipped = labelled & ~usable
    return torch.where(usable & labelled, token_ce.double(), 0.0), (
        skipped.view(target.shape[0], -1).sum(1, dtype=torch.float64) if by_row else skipped.sum(dtype=torch.float64))


def _blocked_cross_entropy(rows: torch.Tensor, labels: torch.Tensor, block_logits: int) -> torch.Tensor:
    """float32 [N]: the cross-entropy of every row of ``rows`` [N, V] at its label (clamped into the vocabulary:
    the callers mask ignored and out-of-vocabulary labels), in blocks of ``max(1, block_logits // V)`` rows:
    `block_cross_entropy`, fused on CUDA (`fused_block_cross_entropy`)."""
    step, clamped = max(1, block_logits // rows.shape[-1]), labels.clamp(0, rows.shape[-1] - 1)
    loss = fused_block_cross_entropy if rows.is_cuda else block_cross_entropy
    return torch.cat([loss(block, block_labels) for block, block_labels in zip(rows.split(step), clamped.split(step))])


def token_sums(stats: EventTokenStats) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fields [2, F]: right, total; loss [2, 4 + 1]: summed loss and events per category, then the skipped
    labelled tokens and 0)`` of one batch."""
    fields = torch.stack([stats.field_correct, stats.field_total])
    n_cat = len(CATEGORY_NAMES)
    if stats.loss_sum is None:
        return fields, torch.zeros((2, n_cat + 1), dtype=torch.float64, device=fields.device)
    # per category, in row order; the undecoded targets land in the last column, which is then overwritten
    per_category = torch.zeros((2, n_cat + 1), dtype=torch.float64, device=fields.device).index_add_(
        1, stats.category, torch.stack([stats.loss_sum, torch.ones_like(stats.loss_sum)]))
    per_category[:, -1] = torch.stack([stats.loss_skipped, torch.zeros_like(stats.loss_skipped)])
    return fields, per_category


def token_report(fields: torch.Tensor, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """``token_accuracy/{field}``; ``{cat}/loss`` (summed token cross-entropy of an event, averaged over the
    category's target events, comparable or not), ``{cat}/loss_sum``, and ``count/loss_skipped_tokens``: labelled
    tokens left out of the loss (a label id past the logits' vocabulary, or a non-finite loss from NaN / inf logits)."""
    out = {f"token_accuracy/{name}": ratio(fields[0, i], fields[1, i]) for i, name in enumerate(TOKEN_FIELDS)}
    for i, cat in enumerate(CATEGORY_NAMES):
        out[f"{cat}/loss"] = ratio(loss[0, i], loss[1, i])
        out[f"{cat}/loss_sum"] = torch.where(loss[1, i] > 0, loss[0, i], float("nan"))
    out["count/loss_skipped_tokens"] = loss[0, -1]
    return out
