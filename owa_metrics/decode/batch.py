"""Token-id tensors [B, T] -> one row per target event, with torch ops only (the hot path).

The decoder never loops over events or tokens in Python. It works in three steps:

1. spans: every ``<EVENT_START>`` opens a span (closed by the next ``<EVENT_END>``, cut by the next start
   or the row's last label that is not ignored: trailing -100 is padding); an ``<EVENT_END>`` with no
   start since the previous end is a span too, whose start was cut off (the first target event after the
   teacher-forcing shift) — all found with prefix/suffix scans.
2. fields: a window of the longest layout's width is gathered at each span and checked slot by slot
   against the layout of its type token; the first failing slot gives the status (`Status`), exactly as the
   string codec's cursor does. Screen data (a run of image tokens of any length) is checked with one
   suffix scan for "next token that is not an image token".
3. pairing: teacher forcing decodes the prediction at the target's positions (positions ignored in the
   target are ignored in the prediction); generation pairs the k-th predicted event with the k-th target
   event of the same row and counts the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Literal, NamedTuple

import torch

from ..events.event import Category, Kind, Status
from ..tokens.codec import CodecConfig
from ..tokens.vocab import IMAGE_BIT, ROLE_MASK, SKIP_BIT, STRUCT_BIT, VALUE_SHIFT, Role, VocabMap

Alignment = Literal["teacher_forcing", "generation"]
IGNORE_INDEX = -100


@dataclass
class EventFields:
    """Decoded fields of one side (target or prediction), one row per target event.

    Values are meaningful where ``status == Status.VALID``; elsewhere numbers are 0, digits -1 and the
    category is ``Category.INVALID``. ``kind`` is what the type token said (-1: none), valid or not.
    ``start`` / ``end`` are the token span in the side's own sequence (inclusive; -1: no predicted event).
    """

    status: torch.Tensor
    kind: torch.Tensor
    category: torch.Tensor
    timestamp_ns: torch.Tensor
    vk: torch.Tensor
    action: torch.Tensor  # 0 press, 1 release
    dx: torch.Tensor
    dy: torch.Tensor
    button_flags: torch.Tensor
    button_data: torch.Tensor
    timestamp_digits: torch.Tensor  # [N, len(timestamp_bases)]
    dx_digits: torch.Tensor  # [N, len(mouse_delta_bases)], sign digit first
    dy_digits: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor

    def take(self, index: torch.Tensor) -> "EventFields":
        return EventFields(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def masked(self, keep: torch.Tensor) -> "EventFields":
        """Blank the decoded values where ``keep`` is False (status, kind and span stay)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in _KEPT and value.numel():
                fill = int(Category.INVALID) if f.name == "category" else (0 if f.name in _ZERO_FILL else -1)
                value = torch.where(keep.view(-1, *([1] * (value.dim() - 1))), value, fill)
            out[f.name] = value
        return EventFields(**out)

    @staticmethod
    def missing(n: int, config: CodecConfig, device) -> "EventFields":
        """``n`` rows with no predicted event (generation with fewer predicted than target events)."""
        def full(value, width=None):
            shape = (n,) if width is None else (n, width)
            return torch.full(shape, value, dtype=torch.int64, device=device)

        return EventFields(
            status=full(int(Status.MISSING)), kind=full(-1), category=full(int(Category.INVALID)),
            timestamp_ns=full(0), vk=full(0), action=full(0), dx=full(0), dy=full(0), button_flags=full(0),
            button_data=full(0), timestamp_digits=full(-1, len(config.timestamp_bases)),
            dx_digits=full(-1, len(config.mouse_delta_bases)), dy_digits=full(-1, len(config.mouse_delta_bases)),
            start=full(-1), end=full(-1),
        )


_ZERO_FILL = {"timestamp_ns", "vk", "action", "dx", "dy", "button_flags", "button_data"}
_KEPT = {"status", "kind", "start", "end"}


@dataclass
class EventBatch:
    """One row per target event of a batch: where it is, both sides' fields and how they compare.

    ``status`` is the comparison status: VALID (comparable: both decode, same kind), TYPE_MISMATCH, the
    prediction's own decode status (INVALID_FORMAT, MISSING_FIELDS, TRUNCATED, MISSING) or INVALID_TARGET.
    ``target_count`` / ``pred_count`` [num_sequences] count events per sequence (equal under teacher forcing).
    """

    seq_idx: torch.Tensor
    status: torch.Tensor
    target: EventFields
    pred: EventFields
    target_count: torch.Tensor
    pred_count: torch.Tensor
    num_sequences: int
    alignment: Alignment

    def __len__(self) -> int:
        return int(self.seq_idx.numel())

    @property
    def comparable(self) -> torch.Tensor:
        return self.status == int(Status.VALID)

    @property
    def device(self) -> torch.device:
        return self.seq_idx.device


def align_teacher_forcing(preds_or_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF causal-LM convention (position t predicts label t + 1) -> ``(preds, target)`` aligned position by position.

    Logits [B, T, V] are argmaxed on their own device; ids [B, T] are taken as they are. The first target
    event loses its ``<EVENT_START>`` to the shift; the decoder still counts it.
    """
    preds = preds_or_logits.argmax(-1) if preds_or_logits.is_floating_point() else preds_or_logits
    if preds.shape != labels.shape:
        raise ValueError(f"logits/preds {tuple(preds_or_logits.shape)} do not match labels {tuple(labels.shape)}")
    return preds[..., :-1], labels[..., 1:]


def decode_batch(preds: torch.Tensor, target: torch.Tensor, vocab: VocabMap,
                 alignment: Alignment = "teacher_forcing") -> EventBatch:
    """Decode predicted and target token ids into an `EventBatch` (one row per target event).

    ``target`` [B, T] may hold -100 (ignored: padding, image labels). Teacher forcing: ``preds`` [B, T] is
    already aligned (`align_teacher_forcing`). Generation: ``preds`` [B, T'] holds the generated tokens
    (pad them with -100), paired event by event with the target's. Malformed events become rows with a
    status; nothing raises.
    """
    preds, target = _check_inputs(preds, target, alignment)
    layouts = _Layouts.get(vocab.config, target.device)
    t_code = vocab.codes(target)
    t_spans = _spans(t_code)
    tgt = _decode_side(t_code, t_spans, layouts)
    B = target.shape[0]
    target_count = torch.bincount(t_spans.seq, minlength=B)
    if alignment == "teacher_forcing":  # positions ignored in the target are ignored in the prediction
        p_code = vocab.codes(torch.where(target < 0, IGNORE_INDEX, preds))
        pred = _decode_side(p_code, t_spans, layouts)
        pred_count = target_count
    else:
        p_code = vocab.codes(preds)
        p_spans = _spans(p_code)
        pred_count = torch.bincount(p_spans.seq, minlength=B)
        pred = _pair_by_index(t_spans.seq, target_count, pred_count, _decode_side(p_code, p_spans, layouts),
                              vocab.config)
    status = torch.where(
        tgt.status != int(Status.VALID), int(Status.INVALID_TARGET),
        torch.where(pred.status != int(Status.VALID), pred.status,
                    torch.where(pred.kind != tgt.kind, int(Status.TYPE_MISMATCH), int(Status.VALID))))
    return EventBatch(seq_idx=t_spans.seq, status=status, target=tgt, pred=pred, target_count=target_count,
                      pred_count=pred_count, num_sequences=B, alignment=alignment)


def _check_inputs(preds, target, alignment):
    if alignment not in ("teacher_forcing", "generation"):
        raise ValueError(f"alignment must be 'teacher_forcing' or 'generation', got {alignment!r}")
    for name, x in (("preds", preds), ("target", target)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(x).__name__}")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(
                f"{name} must hold integer token ids, got dtype {x.dtype}; for logits use "
                "owa_metrics.align_teacher_forcing(logits, labels), which argmaxes and shifts")
        if x.dim() not in (1, 2):
            raise ValueError(f"{name} must be [batch, seq_len] (or [seq_len]), got shape {tuple(x.shape)}")
    preds, target = (x if x.dim() == 2 else x.unsqueeze(0) for x in (preds, target))
    if preds.shape[0] != target.shape[0] or (alignment == "teacher_forcing" and preds.shape != target.shape):
        need = "the same shape" if alignment == "teacher_forcing" else "the same batch size"
        raise ValueError(f"preds {tuple(preds.shape)} and target {tuple(target.shape)} must have {need} ({alignment})")
    if preds.device != target.device:
        raise ValueError(f"preds on {preds.device} and target on {target.device}: put both on one device")
    # an empty row decodes like a row of ignored labels; one such column keeps the scans well defined
    pad = lambda x: torch.nn.functional.pad(x, (0, 1), value=IGNORE_INDEX) if x.shape[-1] == 0 else x  # noqa: E731
    return pad(preds), pad(target)


class _Spans(NamedTuple):
    """Event spans of one side: row, first and last token as positions in the flattened [B * T] tensor."""

    seq: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    cut: torch.Tensor  # the span's <EVENT_START> was cut off (it starts at its type token)
    row_len: int


def _spans(code: torch.Tensor) -> _Spans:
    """Every event span, in (row, position) order, from the sparse list of start / end tokens."""
    B, T = code.shape
    flat = code.view(-1)
    struct = ((flat & STRUCT_BIT) != 0).nonzero().squeeze(1)  # ascending flat positions of starts and ends
    is_start = (flat.index_select(0, struct) & ROLE_MASK) == int(Role.START)
    row = torch.div(struct, T, rounding_mode="floor")
    same_row = row[1:] == row[:-1]
    no = torch.zeros(1, dtype=torch.bool, device=code.device)
    next_end = torch.cat([same_row & ~is_start[1:], no])
    next_start = torch.cat([same_row & is_start[1:], no])
    prev_start = torch.cat([no, same_row & is_start[:-1]])
    prev_end = torch.cat([no, same_row & ~is_start[:-1]])
    orphan = ~is_start & ~prev_start  # an end with no start since the previous end
    sel = (is_start | orphan).nonzero().squeeze(1)
    seq, at, cut = row[sel], struct[sel], orphan[sel]
    nxt = torch.cat([struct[1:], struct[:1]])[sel]
    prv = torch.cat([struct[:1], struct[:-1]])[sel]

    # counts of tokens that are neither ignored nor episode tokens locate "first / last such token" by search
    kept = ((flat & SKIP_BIT) == 0).cumsum(0)
    row_end = torch.arange(1, B + 1, device=code.device) * T - 1
    row_last = torch.searchsorted(kept, kept[row_end])  # trailing ignored labels are padding, not event
    last = torch.where(cut | next_end[sel], torch.where(cut, at, nxt),
                       torch.where(next_start[sel], nxt - 1, row_last[seq]))
    first = at.clone()
    orphans = cut.nonzero().squeeze(1)
    if orphans.numel():  # a cut-off span starts at the first kept token after the previous end (or row start)
        before = torch.where(prev_end[sel][orphans], prv[orphans], seq[orphans] * T - 1)
        count = torch.where(before >= 0, kept[before.clamp(min=0)], 0)
        first[orphans] = torch.searchsorted(kept, count + 1)
    return _Spans(seq, first, last, cut, T)


class _Layouts:
    """Per-slot expectations of each event layout, as tensors: allowed roles (bit mask) and digit bound."""

    KEYBOARD, MOUSE, MOUSE_SCROLL, SCREEN = range(4)
    _cache: dict = {}

    def __init__(self, c: CodecConfig, device):
        def digits(bases):
            return [(1 << int(Role.DIGIT), b) for b in bases]

        head = [(1 << int(Role.START), 0),
                ((1 << int(Role.KEYBOARD)) | (1 << int(Role.MOUSE)) | (1 << int(Role.SCREEN)), 0),
                *digits(c.timestamp_bases)]
        end = [(1 << int(Role.END), 0)]
        deltas = digits(b for base in c.mouse_delta_bases for b in (base, base))
        mouse = head + deltas + digits(c.button_flag_bases)
        layouts = [
            head + digits([c.num_digit_tokens]) + [((1 << int(Role.PRESS)) | (1 << int(Role.RELEASE)), 0)] + end,
            mouse + end,
            mouse + digits(c.scroll_bases) + end,
            head,  # + image data and <EVENT_END>, checked with a count
        ]
        self.width = max(len(slots) for slots in layouts)
        pad = [(0, 0)] * self.width
        self.allowed = torch.tensor([[a for a, _ in (s + pad)[:self.width]] for s in layouts], device=device)
        self.bound = torch.tensor([[b for _, b in (s + pad)[:self.width]] for s in layouts], device=device)
        self.length = torch.tensor([len(s) for s in layouts], device=device)
        self.offsets = torch.arange(self.width, device=device)
        self.head, self.scroll_slot = len(head), len(mouse)
        self.n_ts, self.n_delta = len(c.timestamp_bases), len(c.mouse_delta_bases)
        self.vk_slot, self.action_slot = 2 + self.n_ts, 3 + self.n_ts
        self.delta_slots = slice(2 + self.n_ts, 2 + self.n_ts + 2 * self.n_delta)
        self.flag_slots = slice(self.delta_slots.stop, len(mouse))
        self.scroll_slots = slice(len(mouse), len(mouse) + len(c.scroll_bases))
        self.ts_weights = _weights(c.timestamp_bases, device)
        self.delta_weights, self.delta_range = _weights(c.mouse_delta_bases, device), math.prod(c.mouse_delta_bases)
        self.flag_weights = _weights(c.button_flag_bases, device)
        self.scroll_weights, self.scroll_range = _weights(c.scroll_bases, device), math.prod(c.scroll_bases)
        self.unit_ns, self.scroll_unit = c.timestamp_unit_ns, c.scroll_unit
        # values of a row that does not decode: category INVALID, numbers 0
        self.blank = torch.tensor([int(Category.INVALID)] + [0] * 7, device=device)

    @classmethod
    def get(cls, config: CodecConfig, device) -> "_Layouts":
        key = (config, torch.device(device))
        if key not in cls._cache:
            cls._cache[key] = cls(config, device)
        return cls._cache[key]


def _weights(bases, device) -> torch.Tensor:
    """Place values of mixed-radix digits, most significant first."""
    return torch.tensor([math.prod(bases[i + 1:]) for i in range(len(bases))], dtype=torch.int64, device=device)


def _signed(value: torch.Tensor, total: int) -> torch.Tensor:
    return torch.where(value >= total // 2, value - total, value)


def _decode_side(code: torch.Tensor, spans: _Spans, L: _Layouts) -> EventFields:
    """Check and decode the events at ``spans`` in one side's packed token codes."""
    flat = code.view(-1)
    n = spans.seq.numel()
    slot0 = spans.first - spans.cut.long()  # flat position of <EVENT_START> (virtual for a cut-off start)
    pos = slot0[:, None] + L.offsets
    inside = pos <= spans.last[:, None]
    window = flat.index_select(0, pos.clamp(0, flat.numel() - 1).view(-1)).view(n, L.width)
    r, v = window & ROLE_MASK, (window >> VALUE_SHIFT) - 1

    type_ok = inside[:, 1] & (r[:, 1] >= int(Role.KEYBOARD)) & (r[:, 1] <= int(Role.SCREEN))
    kind = torch.where(type_ok, r[:, 1] - int(Role.KEYBOARD), -1)
    is_kb, is_mouse, is_screen = kind == int(Kind.KEYBOARD), kind == int(Kind.MOUSE), kind == int(Kind.SCREEN)
    has_scroll = inside[:, L.scroll_slot] & (r[:, L.scroll_slot] == int(Role.DIGIT))
    lay = torch.where(is_mouse, torch.where(has_scroll, L.MOUSE_SCROLL, L.MOUSE),
                      torch.where(is_screen, L.SCREEN, L.KEYBOARD))
    allowed, bound, length = L.allowed[lay], L.bound[lay], L.length[lay]

    # slot by slot: the first slot that fails gives the status
    role_ok = ((allowed >> r) & 1).bool() & ((bound == 0) | (v < bound))
    code_ = torch.where(role_ok, int(Status.VALID),
                        torch.where((r == int(Role.END)) | (r == int(Role.IGNORED)),
                                    int(Status.MISSING_FIELDS), int(Status.INVALID_FORMAT)))
    code_ = torch.where(inside, code_, int(Status.TRUNCATED))
    checked = L.offsets < length[:, None]
    checked[:, 0] &= ~spans.cut
    bad = checked & (code_ != int(Status.VALID))
    status = torch.where(bad.any(1), code_.gather(1, bad.long().argmax(1, keepdim=True)).squeeze(1), int(Status.VALID))

    # screen data: a run of image tokens (or ignored labels) closed by <EVENT_END> at the span's last token
    data_start = slot0 + L.head
    not_image = ((flat & IMAGE_BIT) == 0).cumsum(0)
    others = not_image[spans.last] - not_image[(data_start - 1).clamp(max=flat.numel() - 1)]
    first_data, last_role = r[:, L.head], flat.index_select(0, spans.last) & ROLE_MASK
    first_is_data = (first_data == int(Role.IMAGE)) | (first_data == int(Role.IGNORED))
    screen_status = torch.where(
        others <= 0, int(Status.TRUNCATED),
        torch.where(~first_is_data, torch.where(first_data == int(Role.END), int(Status.MISSING_FIELDS),
                                                int(Status.INVALID_FORMAT)),
                    torch.where((others == 1) & (last_role == int(Role.END)), int(Status.VALID),
                                int(Status.INVALID_FORMAT))))
    status = torch.where(is_screen & (status == int(Status.VALID)), screen_status, status)
    # tokens after the layout's <EVENT_END> inside the span (a teacher-forced prediction ending early)
    extra = ~is_screen & (slot0 + length - 1 < spans.last)
    status = torch.where((status == int(Status.VALID)) & extra, int(Status.INVALID_FORMAT), status)
    ok = status == int(Status.VALID)

    ts_digits = v[:, 2:2 + L.n_ts]
    delta_digits = v[:, L.delta_slots].view(n, L.n_delta, 2)  # interleaved dx0 dy0 dx1 dy1 ...
    dxy = _signed((delta_digits * L.delta_weights[:, None]).sum(1), L.delta_range) * is_mouse[:, None]
    flags = (v[:, L.flag_slots] * L.flag_weights).sum(1) * is_mouse
    scroll = _signed((v[:, L.scroll_slots] * L.scroll_weights).sum(1), L.scroll_range) * (is_mouse & has_scroll)
    category = torch.where(is_mouse, torch.where(flags != 0, int(Category.MOUSE_OP), int(Category.MOUSE_NOP)),
                           torch.where(is_screen, int(Category.SCREEN), int(Category.KEYBOARD)))
    values = torch.stack([
        category, (ts_digits * L.ts_weights).sum(1) * L.unit_ns, v[:, L.vk_slot] * is_kb,
        (is_kb & (r[:, L.action_slot] == int(Role.RELEASE))).long(), dxy[:, 0], dxy[:, 1], flags,
        scroll * L.scroll_unit], dim=1)
    values = torch.where(ok[:, None], values, L.blank)
    digits = torch.cat([ts_digits, delta_digits[:, :, 0], delta_digits[:, :, 1]], dim=1)
    digit_ok = torch.cat([ok[:, None].expand(n, L.n_ts), (ok & is_mouse)[:, None].expand(n, 2 * L.n_delta)], dim=1)
    digits = torch.where(digit_ok, digits, -1)
    row_start = spans.seq * spans.row_len
    return EventFields(
        status=status, kind=kind, category=values[:, 0], timestamp_ns=values[:, 1], vk=values[:, 2],
        action=values[:, 3], dx=values[:, 4], dy=values[:, 5], button_flags=values[:, 6], button_data=values[:, 7],
        timestamp_digits=digits[:, :L.n_ts], dx_digits=digits[:, L.n_ts:L.n_ts + L.n_delta],
        dy_digits=digits[:, L.n_ts + L.n_delta:], start=spans.first - row_start, end=spans.last - row_start)


def _pair_by_index(t_seq, target_count, pred_count, pred_all: EventFields, config: CodecConfig) -> EventFields:
    """Generation: the k-th target event of a row is paired with the k-th predicted event of that row."""
    n = t_seq.numel()
    if pred_all.status.numel() == 0:
        return EventFields.missing(n, config, t_seq.device)
    rank = torch.arange(n, device=t_seq.device) - (torch.cumsum(target_count, 0) - target_count)[t_seq]
    matched = rank < pred_count[t_seq]
    index = torch.where(matched, (torch.cumsum(pred_count, 0) - pred_count)[t_seq] + rank, 0)
    paired = pred_all.take(index).masked(matched)
    return replace(paired, status=torch.where(matched, paired.status, int(Status.MISSING)),
                   kind=torch.where(matched, paired.kind, -1), start=torch.where(matched, paired.start, -1),
                   end=torch.where(matched, paired.end, -1))
