"""Token-id tensors [B, T] -> one row per target event, with torch ops only (the hot path).

The decoder never loops over events or tokens in Python. It works in three steps:

1. spans: every ``<EVENT_START>`` opens a span (closed by the next ``<EVENT_END>``, cut by the next start
   or the row's last label that is not ignored: trailing -100 is padding); an ``<EVENT_END>`` with no
   start since the previous end is a span too, whose start was cut off (the first target event after the
   teacher-forcing shift) — all found with a prefix scan and searches over running counts; reading the
   number of target events is the one host sync.
2. pairing: teacher forcing decodes the prediction at the target's positions (positions ignored in the
   target are ignored in the prediction); generation pairs the k-th predicted event with the k-th target
   event of the same row (found by a search) and counts the rest.
3. fields: a window one slot wider than the longest layout is gathered at the target and the paired spans
   (both sides at once) and checked slot by slot against the layout of its type token; the first failing slot
   gives the status (`Status`), exactly as the string codec's cursor does. Screen data (a run of image tokens
   of any length) is checked with one running count of the tokens that are not image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Optional, Union

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
    return _decode_with_torch(preds, target, vocab, alignment, layouts)


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
    long = lambda x: x if x.dtype == torch.long else x.long()  # noqa: E731  (any int dtype; no op when int64)
    preds, target = (long(x) if x.dim() == 2 else long(x).unsqueeze(0) for x in (preds, target))
    if preds.shape[0] != target.shape[0] or (alignment == "teacher_forcing" and preds.shape != target.shape):
        need = "the same shape" if alignment == "teacher_forcing" else "the same batch size"
        raise ValueError(f"preds {tuple(preds.shape)} and target {tuple(target.shape)} must have {need} ({alignment})")
    if preds.device != target.device:
        raise ValueError(f"preds on {preds.device} and target on {target.device}: put both on one device")
    # an empty row decodes like a row of ignored labels; one such column keeps the scans well defined
    pad = lambda x: torch.nn.functional.pad(x, (0, 1), value=IGNORE_INDEX) if x.shape[-1] == 0 else x  # noqa: E731
    return pad(preds), pad(target)


def _decode_with_torch(preds, target, vocab: VocabMap, alignment: Alignment, L: "_Tables") -> EventBatch:
    """The torch ops: both sides' codes in one [2B, W] tensor, the spans from dense scans, then every row of both
    sides checked and read at once (`_decode_rows`). One host sync: the number of target events (``nonzero``)."""
    B, T = target.shape
    generation = alignment == "generation"
    if generation:  # the generated rows under the target rows, padded to one width with ignored labels
        W = max(T, preds.shape[1])
        ids = torch.cat([x if x.shape[1] == W else torch.nn.functional.pad(x, (0, W - x.shape[1]), value=IGNORE_INDEX)
                         for x in (target, preds)])
    else:  # positions ignored in the target are ignored in the prediction
        W = T
        ids = torch.cat([target, torch.where(target < 0, IGNORE_INDEX, preds)])
    code = vocab.codes(ids)
    scans = _Scans(code if generation else code[:B])
    at = scans.marks[:B * W].nonzero().squeeze(1)  # the target spans: the one host sync
    n = at.numel()
    seq = torch.div(at, W, rounding_mode="floor")
    counts = scans.marks.view(1 + generation, B, W).sum(2)  # [sides scanned, B]: events per row
    present = None
    if generation:  # the k-th target event of a row is paired with the k-th generated event of that row
        before = counts.cumsum(1) - counts  # events in the rows above
        rank = torch.arange(n, device=at.device) - before[0].index_select(0, seq)
        present = torch.cat([torch.ones_like(rank, dtype=torch.bool), rank < counts[1].index_select(0, seq)])
        # the k-th generated span of row b: where the running count of generated marks first exceeds before + k
        paired = torch.searchsorted(scans.marks[B * W:].cumsum(0), before[1].index_select(0, seq) + rank, right=True)
        first, last, cut = scans.spans(torch.cat([at, (paired + B * W).clamp(max=2 * B * W - 1)]))
    else:  # the prediction is read at the target's spans, one side down
        first, last, cut = scans.spans(at)
        first, last, cut = torch.cat([first, first + B * W]), torch.cat([last, last + B * W]), torch.cat([cut, cut])
    status, kind, values, digits = _decode_rows(code.view(-1), first, last, cut, L, present)
    row_start = torch.div(first, W, rounding_mode="floor") * W
    rows = torch.stack([status, kind, first - row_start, last - row_start])
    if present is not None:  # a target event without its k-th generated one: MISSING, no span
        rows = torch.where(present, rows, L.missing[:, None])
        cut = cut & present
    rows, cuts = rows.view(8, n).unbind(0), cut.view(2, n).unbind(0)
    values, digits = (x.view(x.shape[0], 2, n).permute(1, 2, 0).unbind(0) for x in (values, digits))  # [n, columns]
    tgt, pred = (EventFields(status=rows[i], kind=rows[2 + i], values=values[i], digits=digits[i], start=rows[4 + i],
                             end=rows[6 + i], start_cut=cuts[i], n_timestamp_digits=L.n_ts) for i in (0, 1))
    # a type token of another kind is a type mismatch; under teacher forcing whatever the data tokens after it
    decided = pred.status == int(Status.VALID) if generation else pred.kind >= 0
    status = torch.where(
        tgt.status != int(Status.VALID), int(Status.INVALID_TARGET),
        torch.where(decided & (pred.kind != tgt.kind), int(Status.TYPE_MISMATCH), pred.status))
    return EventBatch(seq_idx=seq, status=status, target=tgt, pred=pred, target_count=counts[0],
                      pred_count=counts[-1], num_sequences=B, alignment=alignment)


class _Scans:
    """Where the event spans of rows of packed codes [R, W] are, from prefix scans (no host sync).

    A span opens at every ``<EVENT_START>`` and at every ``<EVENT_END>`` with no start since the previous end (its
    start was cut off: the first target event after the teacher-forcing shift); ``marks`` [R * W] flags them.
    A struct token is encoded as ``2 pos + (1 if start)`` (-2: none); per flat position, ``info`` [2, R * W] holds
    the token's own code and the last one before it in its row; ``counts`` [2, R * W] the running numbers of
    struct and of kept tokens (not ignored / episode) through it, whose searches find the next ones.
    """

    def __init__(self, code: torch.Tensor):
        self.W = code.shape[1]
        pos = torch.arange(self.W, device=code.device)
        struct, kept = (code & STRUCT_BIT) != 0, (code & SKIP_BIT) == 0
        here = torch.where(struct, 2 * pos + ((code & ROLE_MASK) == int(Role.START)), -2)
        before = torch.nn.functional.pad(here.cummax(1).values[:, :-1], (1, 0), value=-2)
        self.marks = (struct & ((here & 1) >= (before & 1))).view(-1)  # a start, or an end whose previous is no start
        self.info = torch.stack([here, before]).view(2, -1)
        self.counts = torch.stack([struct, kept]).view(2, -1).cumsum(1, dtype=torch.int32)
        self.kept = kept.view(-1).int()
        self.row_last = torch.where(kept, pos, -1).amax(1)  # trailing ignored / episode tokens are padding

    def spans(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(first, last, cut)`` flat positions of the spans marked at flat positions ``at``."""
        here, before = self.info.index_select(1, at)
        structs, kept = self.counts
        row = torch.div(at, self.W, rounding_mode="floor")
        row_start = row * self.W
        # the k-th struct / kept token is where the running count first reaches k
        nxt = torch.searchsorted(structs, structs.index_select(0, at) + 1)  # the next struct token (maybe a later row)
        nxt_code = self.info[0].index_select(0, nxt.clamp(max=len(structs) - 1))
        # cut by the next start (before it), closed by the next end, or cut by the row's last kept token
        last = torch.where(nxt >= row_start + self.W, row_start + self.row_last.index_select(0, row), nxt - (nxt_code & 1))
        cut = (here & 1) == 0  # a cut-off span starts at the first kept token after the previous end (or row start)
        after = row_start + (before >> 1) + 1
        first = torch.searchsorted(kept, kept.index_select(0, after) - self.kept.index_select(0, after) + 1)
        return torch.where(cut, first, at), torch.where(cut, at, last), cut


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
        # the torch ops check one slot more: a run layout's first data token (an image token or an ignored label);
        # in another layout the slot after <EVENT_END> accepts nothing (a teacher-forced prediction ending early)
        self.window = self.width + 1
        data = [(1 << int(Role.IMAGE)) | (1 << int(Role.IGNORED)) | 0x7FFF << 16]
        window_rules = [(row[:len(r)] + (data if run >= 0 else [0]) + row[len(r):])[:self.window]
                        for row, r, run in zip(rules, slot_rules, runs)]
        checked = [len(r) + (run >= 0) for r, run in zip(slot_rules, runs)]  # slots whose failure is a status
        self.offsets = torch.arange(self.window, dtype=torch.int32, device=device)[:, None]
        # float32 reads every field exactly while a row's sum stays below 2^24 (any token value is below 256)
        exact32 = float(place.abs().sum(-1).max()) * 256 < 2 ** 24
        self.place = torch.nn.functional.pad(self.fields, (0, 1)).to(torch.float32 if exact32 else torch.float64)
        # values of a row that does not decode: category INVALID, numbers 0
        self.blank = torch.tensor([int(Category.INVALID)] + [0] * 7, device=device)
        # for the torch ops: each layout's columns in one column (window rules, checked slots, run start, modulus,
        # the modulus' half (no modulus: never reached), digit slots, digit signs), and lookups by role or kind + 1
        self.n_layouts, self.n_digits = n_lay, len(columns)
        self.digits_at = self.window + 2 + 2 * n_f
        half = torch.where(self.modulus > 0, self.modulus // 2, 1 << 62)
        self.by_layout = torch.cat([torch.tensor(window_rules, device=device), torch.tensor(checked, device=device)[:, None],
                                    self.run_start[:, None], self.modulus, half, self.digit_slots,
                                    self.digit_sign.long()], dim=1).T.contiguous()  # [columns, layouts]
        roles = torch.arange(ROLE_MASK + 1)
        self.kind_of_role = torch.where((roles >= int(Role.KEYBOARD)) & (roles <= int(Role.SCREEN)),
                                        roles - int(Role.KEYBOARD), -1).to(device)
        self.layout_of_kind = torch.cat([self.kind_layout[:1], self.kind_layout])  # kind -1 reads as keyboard
        ends = (roles == int(Role.END)) | (roles == int(Role.IGNORED))  # where a field was expected
        self.missing_status = torch.where(ends, int(Status.MISSING_FIELDS), int(Status.INVALID_FORMAT)).to(device)
        self.kind_category = torch.tensor([int(Category.KEYBOARD), int(Category.KEYBOARD), int(Category.MOUSE_NOP),
                                           int(Category.SCREEN)], device=device)
        self.units = torch.tensor([self.unit_ns if f == "timestamp" else self.scroll_unit if f == "scroll" else 1
                                   for f in FIELDS], device=device)[:, None]
        self.missing = torch.tensor([int(Status.MISSING), -1, -1, -1], device=device)  # status, kind, span

    @classmethod
    def get(cls, config: CodecConfig, device) -> "_Tables":
        key = (config, torch.device(device))
        if key not in cls._cache:
            cls._cache[key] = cls(config, device)
        return cls._cache[key]


def _decode_rows(flat: torch.Tensor, first: torch.Tensor, last: torch.Tensor, cut: torch.Tensor, L: _Tables,
                 present: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check and read the events spanning ``first`` .. ``last`` in the packed codes ``flat``: ``(status, kind,
    values [8, N], digits [D, N])``, values and digits blank where the row does not decode or is not ``present``.

    Works slot-major: ``r`` / ``v`` are [width, N] (slot j of every event in row j).
    """
    n = first.numel()
    cut = cut.long()
    slot0 = first - cut  # flat position of <EVENT_START> (virtual for a cut-off start)
    window = flat.index_select(0, (slot0 + L.offsets).clamp(0, flat.numel() - 1).view(-1)).view(L.window, n)
    r, v = window & ROLE_MASK, (window >> VALUE_SHIFT) - 1
    span_len = last - slot0 + 1

    kind = torch.where(span_len > 1, L.kind_of_role.index_select(0, r[1]), -1)
    lay = L.layout_of_kind.index_select(0, kind + 1)
    for base, longer, at, role in L.variants:  # the format's extended layouts (a mouse event with a scroll)
        lay = torch.where((lay == base) & (span_len > at) & (r[at] == role), longer, lay)
    table = L.by_layout.gather(1, lay.expand(L.by_layout.shape[0], n))  # [columns, N]: this row's layout
    rules, (checked, run_start) = table[:L.window], table[L.window:L.window + 2]
    modulus, half = table[L.window + 2:L.window + 2 + len(FIELDS)], table[L.window + 2 + len(FIELDS):L.digits_at]
    slots, signed = table[L.digits_at:L.digits_at + L.n_digits], table[L.digits_at + L.n_digits:]

    # slot by slot: the first slot whose token is not accepted, or the first past the span, gives the status
    accepted = (rules >> r) & (v < (rules >> 16)) & 1
    first_bad = torch.where((accepted == 0) & (L.offsets >= cut) & (L.offsets < span_len), L.offsets, L.window).amin(0)
    bad_role = r.gather(0, first_bad.clamp(max=L.window - 1)[None]).squeeze(0)
    # a run (screen data): image tokens (or ignored labels) closed by <EVENT_END> at the span's last token
    not_image = ((flat & IMAGE_BIT) == 0).cumsum(0, dtype=torch.int32)
    ends = not_image.index_select(0, torch.cat([last, (slot0 + run_start - 1).clamp(0, flat.numel() - 1)])).view(2, n)
    others = ends[0] - ends[1]  # tokens from the data's start to the span's last that are not image tokens
    closed = (others == 1) & ((flat.index_select(0, last) & ROLE_MASK) == int(Role.END))
    tail = torch.where(run_start >= 0, torch.where(others <= 0, int(Status.TRUNCATED),
                                                   torch.where(closed, int(Status.VALID), int(Status.INVALID_FORMAT))),
                       torch.where(first_bad < L.window, int(Status.INVALID_FORMAT), int(Status.VALID)))
    status = torch.where(first_bad < checked, L.missing_status.index_select(0, bad_role),
                         torch.where(span_len < checked, int(Status.TRUNCATED), tail))
    ok = status == int(Status.VALID)
    if present is not None:
        ok &= present

    # every field of every layout in one product, then each row's layout: (-1)^minus * sum(value * place)
    per_layout = (L.place @ v.to(L.place.dtype)).view(2, L.n_layouts, len(FIELDS), n)
    magnitude, minus = per_layout.gather(1, lay.view(1, 1, 1, n).expand(2, 1, len(FIELDS), n)).squeeze(1)
    number = (magnitude * (1 - 2 * minus)).round().long()
    number = number - modulus * (number >= half)  # a field read modulo its range: the upper half is negative
    kind_category = L.kind_category.index_select(0, kind + 1)  # a mouse event with button flags is a mouse op
    category = kind_category - ((kind == int(Kind.MOUSE)) & (number[FIELDS.index("button_flags")] != 0)).long()
    values = torch.cat([category[None], number * L.units])
    values = torch.where(ok, values, L.blank[:, None])
    digits = v.gather(0, slots.clamp(min=0))
    # a sign level reads as + when its field is 0 (<SIGN_MINUS><0>... is the number 0, written <SIGN_PLUS>...)
    digits = torch.where((signed & (magnitude.index_select(0, L.digit_field) == 0)).bool(), 0, digits)
    digits = torch.where(ok & (slots >= 0), digits, -1)
    return status, kind, values, digits
