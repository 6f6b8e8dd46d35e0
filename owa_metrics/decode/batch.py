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
from typing import Literal

import torch

from ..events.event import Category, Kind, Status
from ..tokens.codec import CodecConfig
from ..tokens.vocab import Role, VocabMap

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
    already aligned (`align_teacher_forcing`). Generation: ``preds`` [B, T'] holds the generated tokens,
    paired event by event with the target's. Malformed events become rows with a status; nothing raises.
    """
    preds, target = _check_inputs(preds, target, alignment)
    layout = _Layouts.get(vocab.config, target.device)
    t_role, t_value = vocab.lookup(target)
    t_spans = _spans(t_role)
    tgt = _decode_side(t_role, t_value, t_spans, layout)
    B = target.shape[0]
    target_count = torch.bincount(t_spans[0], minlength=B)
    p_role, p_value = vocab.lookup(preds)
    if alignment == "teacher_forcing":
        p_role = torch.where(t_role == int(Role.IGNORED), int(Role.IGNORED), p_role)
        pred = _decode_side(p_role, p_value, t_spans, layout)
        pred_count = target_count
    else:
        p_spans = _spans(p_role)
        pred_count = torch.bincount(p_spans[0], minlength=B)
        pred = _pair_by_index(t_spans[0], target_count, pred_count,
                              _decode_side(p_role, p_value, p_spans, layout), vocab.config)
    status = torch.where(
        tgt.status != int(Status.VALID), int(Status.INVALID_TARGET),
        torch.where(pred.status != int(Status.VALID), pred.status,
                    torch.where(pred.kind != tgt.kind, int(Status.TYPE_MISMATCH), int(Status.VALID))))
    return EventBatch(seq_idx=t_spans[0], status=status, target=tgt, pred=pred, target_count=target_count,
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


def _suffix_min(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cummin(-1).values.flip(-1)


def _spans(role: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(seq, first, last, start_cut)`` of every event span, in (row, position) order."""
    B, T = role.shape
    pos = torch.arange(T, device=role.device).expand(B, T)
    is_start, is_end = role == int(Role.START), role == int(Role.END)
    none_left = torch.full((B, 1), -1, dtype=torch.int64, device=role.device)
    none_right = torch.full((B, 1), T, dtype=torch.int64, device=role.device)
    prev_end = torch.cat([none_left, torch.where(is_end, pos, -1).cummax(-1).values[:, :-1]], dim=1)  # < t
    last_start = torch.where(is_start, pos, -1).cummax(-1).values  # <= t
    orphan_end = is_end & (last_start <= prev_end)
    seq, at = (is_start | orphan_end).nonzero(as_tuple=True)
    flat = seq * T + at
    # a start's span ends at the next end, or just before the next start, or at the row's end
    next_end = _suffix_min(torch.where(is_end, pos, T)).view(-1)[flat]
    next_start = torch.cat([_suffix_min(torch.where(is_start, pos, T))[:, 1:], none_right], dim=1).view(-1)[flat]
    kept_last = torch.where(role != int(Role.IGNORED), pos, -1).amax(-1)  # trailing ignored labels are padding
    start_last = torch.minimum(torch.minimum(next_end, next_start - 1), kept_last[seq])
    # a cut-off span starts at the first token after the previous end that is not ignored / an episode token
    skip = (role == int(Role.IGNORED)) | (role == int(Role.EPISODE))
    next_kept = torch.cat([_suffix_min(torch.where(skip, T, pos)), none_right], dim=1)
    cut_first = next_kept.view(-1)[seq * (T + 1) + prev_end.view(-1)[flat] + 1]
    cut = orphan_end.view(-1)[flat]
    return seq, torch.where(cut, cut_first, at), torch.where(cut, at, start_last), cut


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
            head,  # + image data and <EVENT_END>, checked with a scan
        ]
        self.width = max(len(slots) for slots in layouts)
        pad = [(0, 0)] * self.width
        self.allowed = torch.tensor([[a for a, _ in (s + pad)[:self.width]] for s in layouts], device=device)
        self.bound = torch.tensor([[b for _, b in (s + pad)[:self.width]] for s in layouts], device=device)
        self.length = torch.tensor([len(s) for s in layouts], device=device)
        self.head, self.scroll_slot = len(head), len(mouse)
        n_ts, n_d = len(c.timestamp_bases), len(c.mouse_delta_bases)
        self.ts_slots = slice(2, 2 + n_ts)
        self.dx_slots = slice(2 + n_ts, 2 + n_ts + 2 * n_d, 2)
        self.dy_slots = slice(3 + n_ts, 2 + n_ts + 2 * n_d, 2)
        self.flag_slots = slice(2 + n_ts + 2 * n_d, len(mouse))
        self.scroll_slots = slice(len(mouse), len(mouse) + len(c.scroll_bases))
        self.vk_slot, self.action_slot = 2 + n_ts, 3 + n_ts
        self.ts_weights = _weights(c.timestamp_bases, device)
        self.delta_weights, self.delta_range = _weights(c.mouse_delta_bases, device), math.prod(c.mouse_delta_bases)
        self.flag_weights = _weights(c.button_flag_bases, device)
        self.scroll_weights, self.scroll_range = _weights(c.scroll_bases, device), math.prod(c.scroll_bases)
        self.config = c

    @classmethod
    def get(cls, config: CodecConfig, device) -> "_Layouts":
        key = (config, torch.device(device))
        if key not in cls._cache:
            cls._cache[key] = cls(config, device)
        return cls._cache[key]


def _weights(bases, device) -> torch.Tensor:
    """Place values of mixed-radix digits, most significant first."""
    w = [math.prod(bases[i + 1:]) for i in range(len(bases))]
    return torch.tensor(w, dtype=torch.int64, device=device)


def _signed(value: torch.Tensor, total: int) -> torch.Tensor:
    return torch.where(value >= total // 2, value - total, value)


def _decode_side(role, value, spans, L: _Layouts) -> EventFields:
    """Check and decode the events at ``spans`` in one side's (role, digit value) tensors."""
    seq, first, last, cut = spans
    B, T = role.shape
    slot0 = first - cut.long()  # position of <EVENT_START> (virtual for a cut-off start)
    offsets = torch.arange(L.width, device=role.device)
    pos = slot0[:, None] + offsets
    inside = pos <= last[:, None]
    flat = seq[:, None] * T + pos.clamp(0, T - 1)
    r = role.view(-1)[flat]
    v = value.view(-1)[flat]

    type_ok = inside[:, 1] & (r[:, 1] >= int(Role.KEYBOARD)) & (r[:, 1] <= int(Role.SCREEN))
    kind = torch.where(type_ok, r[:, 1] - int(Role.KEYBOARD), -1)
    has_scroll = inside[:, L.scroll_slot] & (r[:, L.scroll_slot] == int(Role.DIGIT))
    lay = torch.where(kind == int(Kind.MOUSE), torch.where(has_scroll, L.MOUSE_SCROLL, L.MOUSE),
                      torch.where(kind == int(Kind.SCREEN), L.SCREEN, L.KEYBOARD))
    allowed, bound, length = L.allowed[lay], L.bound[lay], L.length[lay]

    role_ok = ((allowed >> r) & 1).bool() & ((bound == 0) | (v < bound))
    code = torch.where(role_ok, int(Status.VALID),
                       torch.where((r == int(Role.END)) | (r == int(Role.IGNORED)),
                                   int(Status.MISSING_FIELDS), int(Status.INVALID_FORMAT)))
    code = torch.where(inside, code, int(Status.TRUNCATED))
    checked = offsets < length[:, None]
    checked[:, 0] &= ~cut
    code = torch.where(checked, code, int(Status.VALID))
    bad = code != int(Status.VALID)
    status = torch.where(bad.any(1), code.gather(1, bad.long().argmax(1, keepdim=True)).squeeze(1), int(Status.VALID))

    # the event's <EVENT_END>: fixed slot, or for a screen the first token after its image run
    data_start = slot0 + L.head
    not_image = (role != int(Role.IMAGE)) & (role != int(Role.IGNORED))
    pos_bt = torch.arange(T, device=role.device).expand(B, T)
    next_not_image = torch.cat([_suffix_min(torch.where(not_image, pos_bt, T)),
                                torch.full((B, 1), T, dtype=torch.int64, device=role.device)], dim=1)
    q = next_not_image.view(-1)[seq * (T + 1) + data_start.clamp(max=T)]
    q_is_end = role.view(-1)[seq * T + q.clamp(max=T - 1)] == int(Role.END)
    screen_status = torch.where(q > last, int(Status.TRUNCATED),
                                torch.where(~q_is_end, int(Status.INVALID_FORMAT),
                                            torch.where(q == data_start, int(Status.MISSING_FIELDS), int(Status.VALID))))
    is_screen = lay == L.SCREEN
    status = torch.where(is_screen & (status == int(Status.VALID)), screen_status, status)
    end = torch.where(is_screen, q, slot0 + length - 1)
    status = torch.where((status == int(Status.VALID)) & (end < last), int(Status.INVALID_FORMAT), status)

    ts_digits = v[:, L.ts_slots]
    dx_digits, dy_digits = v[:, L.dx_slots], v[:, L.dy_slots]
    is_mouse = kind == int(Kind.MOUSE)
    flags = (v[:, L.flag_slots] * L.flag_weights).sum(1)
    scroll = _signed((v[:, L.scroll_slots] * L.scroll_weights).sum(1), L.scroll_range)
    category = torch.where(kind == int(Kind.MOUSE), torch.where(flags != 0, int(Category.MOUSE_OP), int(Category.MOUSE_NOP)),
                           torch.where(kind == int(Kind.SCREEN), int(Category.SCREEN), int(Category.KEYBOARD)))
    is_kb = kind == int(Kind.KEYBOARD)
    decoded = EventFields(
        status=status, kind=kind, category=category,
        timestamp_ns=(ts_digits * L.ts_weights).sum(1) * L.config.timestamp_unit_ns,
        vk=torch.where(is_kb, v[:, L.vk_slot], 0),
        action=(is_kb & (r[:, L.action_slot] == int(Role.RELEASE))).long(),
        dx=torch.where(is_mouse, _signed((dx_digits * L.delta_weights).sum(1), L.delta_range), 0),
        dy=torch.where(is_mouse, _signed((dy_digits * L.delta_weights).sum(1), L.delta_range), 0),
        button_flags=torch.where(is_mouse, flags, 0),
        button_data=torch.where(is_mouse & has_scroll, scroll * L.config.scroll_unit, 0),
        timestamp_digits=ts_digits,
        dx_digits=torch.where(is_mouse[:, None], dx_digits, -1),
        dy_digits=torch.where(is_mouse[:, None], dy_digits, -1),
        start=first, end=last,
    )
    return decoded.masked(status == int(Status.VALID))


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
