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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, NamedTuple, Optional, Union

import numpy as np
import torch

from ..events.event import Category, Kind, Status
from ..tokens.codec import CodecConfig
from ..tokens.format import FIELDS, Role
from ..tokens.vocab import IMAGE_BIT, ROLE_MASK, SKIP_BIT, STRUCT_BIT, VALUE_SHIFT, VocabMap
from . import kernel

if TYPE_CHECKING:
    from .matching import TimeMatching

Alignment = Literal["teacher_forcing", "generation"]
Backend = Literal["auto", "torch", "kernel"]
Pairing = Literal["index", "time"]
IGNORE_INDEX = -100


VALUE_COLUMNS = ("category", "timestamp_ns", "vk", "action", "dx", "dy", "button_flags", "button_data")


@dataclass
class EventFields:
    """Decoded fields of one side (target or prediction), one row per target event.

    ``values`` [N, 8] (int64) holds the `VALUE_COLUMNS` (also readable by name: ``fields.dx``; ``action`` 0
    press, 1 release) and ``digits`` [N, n_ts + 2 n_delta] (int32) the timestamp, dx and dy digits (sign first).
    They are meaningful where ``status == Status.VALID``; elsewhere numbers are 0, digits -1 and the
    category is ``Category.INVALID``. ``kind`` is what the type token said (-1: none), valid or not.
    ``start`` / ``end`` are the token span in the side's own sequence (inclusive; -1: no predicted event);
    ``start_cut`` marks a span whose ``<EVENT_START>`` was cut off (it starts at its type token).
    """

    status: torch.Tensor
    kind: torch.Tensor
    values: torch.Tensor
    digits: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    start_cut: torch.Tensor
    n_timestamp_digits: int

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in VALUE_COLUMNS:
            return self.values[:, VALUE_COLUMNS.index(name)]
        raise AttributeError(name)

    @property
    def timestamp_digits(self) -> torch.Tensor:
        return self.digits[:, :self.n_timestamp_digits]

    @property
    def dx_digits(self) -> torch.Tensor:
        n = (self.digits.shape[1] - self.n_timestamp_digits) // 2
        return self.digits[:, self.n_timestamp_digits:self.n_timestamp_digits + n]

    @property
    def dy_digits(self) -> torch.Tensor:
        n = (self.digits.shape[1] - self.n_timestamp_digits) // 2
        return self.digits[:, self.n_timestamp_digits + n:]

    def take(self, index: torch.Tensor) -> "EventFields":
        return replace(self, **{name: getattr(self, name).index_select(0, index) for name in _ROW_TENSORS})

    @staticmethod
    def blank(n: int, config: CodecConfig, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``values`` and ``digits`` of ``n`` rows that did not decode."""
        values = torch.zeros((n, len(VALUE_COLUMNS)), dtype=torch.int64, device=device)
        values[:, 0] = int(Category.INVALID)
        digits = torch.full((n, len(config.token_format.digit_columns)), -1, dtype=torch.int32, device=device)
        return values, digits


_ROW_TENSORS = ("status", "kind", "values", "digits", "start", "end", "start_cut")


@dataclass
class EventBatch:
    """One row per target event of a batch: where it is, both sides' fields and how they compare.

    ``status`` is the comparison status: VALID (comparable: both decode, same kind), TYPE_MISMATCH (the predicted
    type token names another kind: under teacher forcing whatever follows it, in generation the prediction
    decodes), the prediction's own decode status (INVALID_FORMAT, MISSING_FIELDS, TRUNCATED, MISSING) or INVALID_TARGET.
    ``target_count`` / ``pred_count`` [num_sequences] count events per sequence (equal under teacher forcing).
    ``time_matching``: what generation by time found (`owa_metrics.decode.matching.TimeMatching`), else None.
    """

    seq_idx: torch.Tensor
    status: torch.Tensor
    target: EventFields
    pred: EventFields
    target_count: torch.Tensor
    pred_count: torch.Tensor
    num_sequences: int
    alignment: Alignment
    time_matching: Optional["TimeMatching"] = None  # pairing="time": detection counts, errors, extra events

    def __len__(self) -> int:
        return int(self.seq_idx.numel())

    @property
    def comparable(self) -> torch.Tensor:
        return self.status == int(Status.VALID)


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
                 alignment: Alignment = "teacher_forcing", backend: Backend = "auto", pairing: Pairing = "index",
                 tolerance_ms: float = 100.0, origin_ns: Union[None, int, torch.Tensor] = None) -> EventBatch:
    """Decode predicted and target token ids into an `EventBatch` (one row per target event).

    ``target`` [B, T] may hold -100 (ignored: padding, image labels). Teacher forcing: ``preds`` [B, T] is
    already aligned (`align_teacher_forcing`). Generation: ``preds`` [B, T'] holds the generated tokens
    (pad them with -100), paired event by event with the target's. Malformed events become rows with a
    status; nothing raises. ``backend``: ``"auto"`` runs the compiled CPU kernel (`owa_metrics.decode.kernel`)
    for CPU tensors and the torch ops elsewhere; ``"torch"`` / ``"kernel"`` force one (the same results).
    ``pairing="time"`` (generation only) matches generated events to true ones within ``tolerance_ms`` on the
    time axis unwrapped from ``origin_ns`` (one or [B]; default / negative: each row's first valid target event)
    instead of by index: see `owa_metrics.decode.matching`.
    """
    preds, target = _check_inputs(preds, target, alignment)
    if backend not in ("auto", "torch", "kernel"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'kernel', got {backend!r}")
    check_pairing(pairing, alignment)
    if pairing == "time":
        from .matching import decode_by_time, tolerance_ns

        return decode_by_time(preds, target, vocab, backend,
                              tolerance_ns(tolerance_ms, vocab.config.timestamp_window_ns), origin_ns)
    layouts = _Tables.get(vocab.config, target.device)
    if backend == "kernel" or (backend == "auto" and target.device.type == "cpu" and kernel.available()):
        return _decode_with_kernel(preds, target, vocab, alignment, layouts)
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
    # a type token of another kind is a type mismatch; under teacher forcing whatever the data tokens after it
    decided = pred.status == int(Status.VALID) if alignment == "generation" else pred.kind >= 0
    status = torch.where(
        tgt.status != int(Status.VALID), int(Status.INVALID_TARGET),
        torch.where(decided & (pred.kind != tgt.kind), int(Status.TYPE_MISMATCH), pred.status))
    return EventBatch(seq_idx=t_spans.seq, status=status, target=tgt, pred=pred, target_count=target_count,
                      pred_count=pred_count, num_sequences=B, alignment=alignment)


def check_pairing(pairing: Pairing, alignment: Alignment) -> None:
    """Raise if ``pairing`` is unknown or does not apply to ``alignment``."""
    if pairing not in ("index", "time"):
        raise ValueError(f"pairing must be 'index' or 'time', got {pairing!r}")
    if pairing == "time" and alignment != "generation":
        raise ValueError("pairing='time' matches generated events to true ones: use it with alignment='generation' "
                         "(teacher forcing pairs every position with itself)")


def _decode_with_kernel(preds, target, vocab: VocabMap, alignment: Alignment, layouts: "_Tables") -> EventBatch:
    out = kernel_arrays(preds, target, vocab, alignment, layouts)
    sides = [EventFields(n_timestamp_digits=layouts.n_ts, **{k: torch.from_numpy(np.ascontiguousarray(v))
                                                             for k, v in out[side].items()})
             for side in ("target", "pred")]
    return EventBatch(seq_idx=torch.from_numpy(out["seq"]), status=torch.from_numpy(out["status"]), target=sides[0],
                      pred=sides[1], target_count=torch.from_numpy(out["target_count"]),
                      pred_count=torch.from_numpy(out["pred_count"]), num_sequences=target.shape[0], alignment=alignment)


def kernel_arrays(preds, target, vocab: VocabMap, alignment: Alignment, layouts: "_Tables") -> dict:
    """`kernel.decode_arrays` of checked CPU inputs (`_check_inputs`): numpy arrays, no `EventBatch`."""
    if target.device.type != "cpu" or not kernel.available():
        raise ValueError("backend='kernel' needs CPU tensors and numba: use backend='torch' (or 'auto')")
    table, t_ids = vocab.codes_table.numpy(), target.numpy()
    t_code = kernel.codes(t_ids, table)
    p_code = kernel.codes(preds.numpy(), table, t_ids if alignment == "teacher_forcing" else None)
    return kernel.decode_arrays(t_code, p_code, layouts, alignment == "generation")


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
    preds, target = (x.long() if x.dim() == 2 else x.long().unsqueeze(0) for x in (preds, target))  # any int dtype
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
    seq, at, cut = row.index_select(0, sel), struct.index_select(0, sel), orphan.index_select(0, sel)
    nxt = torch.cat([struct[1:], struct[:1]]).index_select(0, sel)
    prv = torch.cat([struct[:1], struct[:-1]]).index_select(0, sel)

    # trailing ignored / episode tokens are padding: a span cut by the row's end stops before them
    kept = (code & SKIP_BIT) == 0
    row_last = (kept * torch.arange(1, T + 1, dtype=torch.int32, device=code.device)).amax(1).long() - 1
    row_last = row_last + torch.arange(B, device=code.device) * T
    last = torch.where(cut | next_end.index_select(0, sel), torch.where(cut, at, nxt),
                       torch.where(next_start.index_select(0, sel), nxt - 1, row_last.index_select(0, seq)))
    first = at.clone()
    orphans = cut.nonzero().squeeze(1)
    if orphans.numel():  # a cut-off span starts at the first kept token after the previous end (or row start)
        before = torch.where(prev_end.index_select(0, sel)[orphans], prv[orphans], seq[orphans] * T - 1)
        first[orphans] = _first_kept_after(kept.view(-1), before)
    return _Spans(seq, first, last, cut, T)


def _first_kept_after(kept: torch.Tensor, before: torch.Tensor, window: int = 16) -> torch.Tensor:
    """First flat position > ``before`` where ``kept``; one exists (the span's end). Usually within a few tokens."""
    pos = before[:, None] + 1 + torch.arange(window, device=kept.device)
    hit = kept[pos.clamp(max=kept.numel() - 1)] & (pos < kept.numel())
    if bool(hit.any(1).all()):
        return pos.gather(1, hit.byte().argmax(1, keepdim=True)).squeeze(1)
    counts = kept.cumsum(0)  # a long ignored run (masked prompt, left padding): count and search
    return torch.searchsorted(counts, torch.where(before >= 0, counts[before.clamp(min=0)], 0) + 1)


class _Tables:
    """The format's layouts (`TokenFormat`) as tensors, one row per layout.

    ``rules`` [layouts, width]: per slot from ``<EVENT_START>``, the accepted roles (bit mask, low 16 bits) and
    the value bound (<< 16); a run layout (screen) stops before its image run, which is checked with a count.
    ``fields`` [2 * layouts * F, width]: place values, then sign selectors, so that one matrix product reads
    every field of every layout; ``modulus`` [layouts, F]; ``digit_slots`` [layouts, D]: the slot of each
    digit-precision level (-1: the layout has none).
    """

    _cache: dict = {}

    def __init__(self, c: CodecConfig, device):
        fmt = c.token_format
        type_roles = (1 << int(Role.KEYBOARD)) | (1 << int(Role.MOUSE)) | (1 << int(Role.SCREEN))
        head = [(1 << int(Role.START), 0), (type_roles, 0)]
        slot_rules, runs = [], []
        for lay in fmt.layouts:
            run = next((i for i, s in enumerate(lay.slots) if s.run), None)
            slots = lay.slots if run is None else lay.slots[:run]
            slot_rules.append(head + [(1 << int(s.role), s.bound) for s in slots]
                              + ([(1 << int(Role.END), 0)] if run is None else []))
            runs.append(-1 if run is None else 2 + run)
        self.width = max(len(r) for r in slot_rules)
        anything = [(0xFFFF, 0)] * self.width  # slots past a layout's end are not checked
        rules = [[a | min(b or 0x7FFF, 0x7FFF) << 16 for a, b in (r + anything)[:self.width]] for r in slot_rules]
        self.rules = torch.tensor(rules, dtype=torch.int32, device=device)
        self.length = torch.tensor([len(r) for r in slot_rules], device=device)
        self.run_start = torch.tensor(runs, device=device)
        self.kind_layout = torch.tensor([fmt.layout_index(k) for k in ("keyboard", "mouse", "screen")], device=device)
        # a layout that extends another is chosen by the role of the token after the shorter one's slots
        self.variants = [(lay.extends, i, 2 + len(fmt.layouts[lay.extends].slots),
                          int(lay.slots[len(fmt.layouts[lay.extends].slots)].role))
                         for i, lay in enumerate(fmt.layouts) if lay.extends is not None]
        n_lay, n_f = len(fmt.layouts), len(FIELDS)
        place = torch.zeros(2, n_lay, n_f, self.width, dtype=torch.float64)
        for li, lay in enumerate(fmt.layouts):
            for si, slot in enumerate(lay.slots):
                if slot.field is not None and not slot.run:
                    place[int(slot.sign), li, FIELDS.index(slot.field), 2 + si] = 1 if slot.sign else slot.place
        self.fields = place.view(2 * n_lay * n_f, self.width).to(device)
        self.modulus = torch.tensor([[fmt.modulus.get(f, 0) for f in FIELDS] for _ in fmt.layouts], device=device)
        columns = fmt.digit_columns
        digit_slots = torch.full((n_lay, len(columns)), -1, dtype=torch.int64)
        for li, lay in enumerate(fmt.layouts):
            for name in set(columns):
                where = [2 + si for si, s in enumerate(lay.slots) if s.field == name]
                at = [i for i, col in enumerate(columns) if col == name]
                digit_slots[li, at[:len(where)]] = torch.tensor(where[:len(at)], dtype=torch.int64)
        self.digit_slots = digit_slots.to(device)
        # a sign level reads as + when its field is 0 (<SIGN_MINUS><0>... is the number 0, written <SIGN_PLUS>...)
        signs = [[lay.slots[j - 2].sign if j >= 2 else False for j in row] for lay, row in zip(fmt.layouts, digit_slots.tolist())]
        self.digit_sign = torch.tensor(signs, dtype=torch.bool, device=device)
        self.digit_field = torch.tensor([FIELDS.index(c) for c in columns], device=device)
        self.arrays = {  # the same tables as numpy arrays, for the CPU kernel
            "rules": self.rules.cpu().numpy().astype(np.int64), "length": self.length.cpu().numpy().astype(np.int64),
            "run_start": self.run_start.cpu().numpy().astype(np.int64),
            "kind_layout": self.kind_layout.cpu().numpy().astype(np.int64),
            **{name: np.array([v[k] for v in self.variants], dtype=np.int64)
               for k, name in enumerate(("var_base", "var_longer", "var_at", "var_role"))},
            "place": place[0].numpy().astype(np.int64), "sign": place[1].numpy().astype(np.int64),
            "modulus": self.modulus.cpu().numpy().astype(np.int64), "digit_slots": digit_slots.numpy(),
            "digit_sign": self.digit_sign.cpu().numpy(), "digit_field": self.digit_field.cpu().numpy().astype(np.int64)}
        self.n_ts = columns.count("timestamp")
        self.unit_ns, self.scroll_unit = fmt.timestamp_unit_ns, fmt.scroll_unit
        self.offsets = torch.arange(self.width, dtype=torch.int32, device=device)[:, None]
        # values of a row that does not decode: category INVALID, numbers 0
        self.blank = torch.tensor([int(Category.INVALID)] + [0] * 7, device=device)

    @classmethod
    def get(cls, config: CodecConfig, device) -> "_Tables":
        key = (config, torch.device(device))
        if key not in cls._cache:
            cls._cache[key] = cls(config, device)
        return cls._cache[key]


def _decode_side(code: torch.Tensor, spans: _Spans, L: _Tables) -> EventFields:
    """Check and decode the events at ``spans`` in one side's packed token codes.

    Works slot-major: ``r`` / ``v`` are [width, N] (slot j of every event in row j).
    """
    flat = code.view(-1)
    n = spans.seq.numel()
    slot0 = spans.first - spans.cut.long()  # flat position of <EVENT_START> (virtual for a cut-off start)
    window = flat.index_select(0, (slot0 + L.offsets).clamp(0, flat.numel() - 1).view(-1)).view(L.width, n)
    r, v = window & ROLE_MASK, (window >> VALUE_SHIFT) - 1
    span_len = spans.last - slot0 + 1

    kind = torch.where((span_len > 1) & (r[1] >= int(Role.KEYBOARD)) & (r[1] <= int(Role.SCREEN)),
                       r[1] - int(Role.KEYBOARD), -1)
    lay = L.kind_layout[kind.clamp(min=0)]
    for base, longer, at, role in L.variants:  # the format's extended layouts (a mouse event with a scroll)
        lay = torch.where((lay == base) & (span_len > at) & (r[min(at, L.width - 1)] == role), longer, lay)
    length, run_start = L.length[lay], L.run_start[lay]
    is_run = run_start >= 0

    # slot by slot: the first slot whose token is not accepted, or the first past the span, gives the status
    rules = torch.nn.functional.embedding(lay, L.rules).T.contiguous()  # [width, N]: this row's layout
    accepted = ((rules >> r) & 1).bool() & (v < (rules >> 16))
    accepted[0] |= spans.cut  # a cut-off start is not checked
    bad = ~accepted & (L.offsets < span_len)
    first_bad = torch.where(bad, L.offsets, L.width).amin(0)
    bad_role = r.gather(0, first_bad.clamp(max=L.width - 1)[None]).squeeze(0)
    status = torch.where(
        first_bad < length,
        torch.where((bad_role == int(Role.END)) | (bad_role == int(Role.IGNORED)),
                    int(Status.MISSING_FIELDS), int(Status.INVALID_FORMAT)),
        torch.where(span_len < length, int(Status.TRUNCATED), int(Status.VALID)))

    # a run (screen data): image tokens (or ignored labels) closed by <EVENT_END> at the span's last token
    data_start = slot0 + run_start.clamp(min=0)
    not_image = ((flat & IMAGE_BIT) == 0).cumsum(0, dtype=torch.int32)
    others = not_image[spans.last] - not_image[(data_start - 1).clamp(0, flat.numel() - 1)]
    first_data = r.gather(0, run_start.clamp(0, L.width - 1)[None]).squeeze(0)
    last_role = flat.index_select(0, spans.last) & ROLE_MASK
    first_is_data = (first_data == int(Role.IMAGE)) | (first_data == int(Role.IGNORED))
    run_status = torch.where(
        others <= 0, int(Status.TRUNCATED),
        torch.where(~first_is_data, torch.where(first_data == int(Role.END), int(Status.MISSING_FIELDS),
                                                int(Status.INVALID_FORMAT)),
                    torch.where((others == 1) & (last_role == int(Role.END)), int(Status.VALID),
                                int(Status.INVALID_FORMAT))))
    status = torch.where(is_run & (status == int(Status.VALID)), run_status, status)
    # tokens after the layout's <EVENT_END> inside the span (a teacher-forced prediction ending early)
    status = torch.where((status == int(Status.VALID)) & ~is_run & (length < span_len), int(Status.INVALID_FORMAT),
                         status)
    ok = status == int(Status.VALID)

    # every field of every layout in one product, then each row's layout: (-1)^minus * sum(value * place)
    per_layout = (L.fields @ v.double()).view(2, L.modulus.shape[0], len(FIELDS), n)
    magnitude, minus = per_layout.gather(1, lay.view(1, 1, 1, n).expand(2, 1, len(FIELDS), n)).squeeze(1)
    number = (magnitude * (1 - 2 * minus)).round().long()
    modulus = L.modulus.index_select(0, lay).T
    number = torch.where((modulus > 0) & (number >= modulus // 2), number - modulus, number)
    ts_units, vk, action, dx, dy, flags, scroll = number
    is_mouse = kind == int(Kind.MOUSE)
    category = torch.where(is_mouse, torch.where(flags != 0, int(Category.MOUSE_OP), int(Category.MOUSE_NOP)),
                           torch.where(kind == int(Kind.SCREEN), int(Category.SCREEN), int(Category.KEYBOARD)))
    values = torch.stack([category, ts_units * L.unit_ns, vk, action, dx, dy, flags, scroll * L.scroll_unit])
    values = torch.where(ok, values, L.blank[:, None]).T.contiguous()
    slots = L.digit_slots.index_select(0, lay).T  # [D, N]
    digits = v.gather(0, slots.clamp(min=0))
    zero = magnitude.index_select(0, L.digit_field) == 0  # [D, N]: the level's field is 0
    digits = torch.where(L.digit_sign.index_select(0, lay).T & zero, 0, digits)
    digits = torch.where(ok & (slots >= 0), digits, -1).T.contiguous()
    row_start = spans.seq * spans.row_len
    return EventFields(status=status, kind=kind, values=values, digits=digits, start=spans.first - row_start,
                       end=spans.last - row_start, start_cut=spans.cut, n_timestamp_digits=L.n_ts)


def _pair_by_index(t_seq, target_count, pred_count, pred_all: EventFields, config: CodecConfig) -> EventFields:
    """Generation: the k-th target event of a row is paired with the k-th predicted event of that row."""
    n = t_seq.numel()
    rank = torch.arange(n, device=t_seq.device) - (torch.cumsum(target_count, 0) - target_count)[t_seq]
    matched = rank < pred_count[t_seq]
    index = torch.where(matched, (torch.cumsum(pred_count, 0) - pred_count)[t_seq] + rank, 0)
    if pred_all.status.numel() == 0:  # nothing generated: every row is missing
        index, pred_all = torch.zeros_like(index), _missing_row(pred_all, config)
    paired = pred_all.take(index)
    blank_values, blank_digits = EventFields.blank(n, config, t_seq.device)
    keep = matched[:, None]
    return replace(paired, status=torch.where(matched, paired.status, int(Status.MISSING)),
                   kind=torch.where(matched, paired.kind, -1), values=torch.where(keep, paired.values, blank_values),
                   digits=torch.where(keep, paired.digits, blank_digits), start=torch.where(matched, paired.start, -1),
                   end=torch.where(matched, paired.end, -1), start_cut=paired.start_cut & matched)


def _missing_row(like: EventFields, config: CodecConfig) -> EventFields:
    device = like.status.device
    values, digits = EventFields.blank(1, config, device)
    minus_one = torch.full((1,), -1, dtype=torch.int64, device=device)
    return EventFields(status=minus_one, kind=minus_one, values=values, digits=digits, start=minus_one,
                       end=minus_one, start_cut=torch.zeros(1, dtype=torch.bool, device=device),
                       n_timestamp_digits=like.n_timestamp_digits)
