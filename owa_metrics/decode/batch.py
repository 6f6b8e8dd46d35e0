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

import functools
import itertools
import weakref
from typing import Optional, Union

import numpy as np
import torch

from ..schema import IMAGE_BIT, KIND_CATEGORY, ROLE_MASK, SKIP_BIT, STRUCT_BIT, VALUE_SHIFT, Category, Kind, Role, Status
from ..tokens.codec import CodecConfig
from ..tokens.format import FIELDS, MAX_BOUND
from ..tokens.vocab import VocabMap
from . import kernel
from .event_batch import Alignment, Backend, EventBatch, EventFields, Pairing
from .matching import DEFAULT_TOLERANCE_MS, pair_by_time, tolerance_ns

IGNORE_INDEX = -100
_N_ROLES = ROLE_MASK + 2  # the roles and NO_ROLE: a span without a type token
KIND_CODES = len(Kind) + 1  # an event's kind code: kind + 1 (0: no type token)


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
                 tolerance_ms: Union[None, float, tuple] = None, origin_ns: Union[None, int, torch.Tensor] = None
                 ) -> EventBatch:
    """Decode predicted and target token ids into an `EventBatch` (one row per target event).

    ``target`` [B, T] may hold -100 (ignored: padding, image labels). Teacher forcing: ``preds`` [B, T] is
    already aligned (`align_teacher_forcing`). Generation: ``preds`` [B, T'] holds the generated tokens
    (pad them with -100), paired event by event with the target's. Malformed events become rows with a
    status; nothing raises. ``backend``: ``"auto"`` runs the compiled CPU kernel (`owa_metrics.decode.kernel`)
    for CPU tensors and the torch ops elsewhere; ``"torch"`` / ``"kernel"`` force one (the same results).
    ``pairing="time"`` (generation only) matches generated events to true ones within ``tolerance_ms`` (default
    100; refused with index pairing, where it has no effect) on the time axis unwrapped from ``origin_ns`` (one or
    [B]; default / negative: each row's first valid target event) instead of by index: see
    `owa_metrics.decode.matching`.
    """
    preds, target = _check_inputs(preds, target, alignment)
    if not isinstance(vocab, VocabMap):
        raise TypeError(f"decode_batch reads token ids with a VocabMap, got {type(vocab).__name__}: build it once "
                        "with owa_metrics.VocabMap.from_tokenizer(tokenizer) and pass that")
    if backend not in ("auto", "torch", "kernel"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'kernel', got {backend!r}")
    check_pairing(pairing, alignment, tolerance_ms)
    if pairing == "time":  # each side decoded on its own (its target side against itself), then matched
        window_ns = vocab.config.timestamp_window_ns
        tolerance = tolerance_ns(DEFAULT_TOLERANCE_MS if tolerance_ms is None else tolerance_ms, window_ns)
        if backend == "kernel" or (backend == "auto" and target.device.type == "cpu" and kernel.available()):
            true, generated = (decode_batch(ids, ids, vocab, "teacher_forcing", backend) for ids in (target, preds))
        else:  # the torch ops: both sides in one decode (one host read), its target side and every generated event
            true = _decode_with_torch(preds, target, vocab, "generation", _Tables.get(vocab.config, target.device),
                                      pair=False)
            generated = EventBatch(seq_idx=true.generated_seq, status=true.generated.status, target=true.generated,
                                   pred=true.generated, target_count=true.pred_count, pred_count=true.pred_count,
                                   num_sequences=true.num_sequences, alignment="teacher_forcing")
        return pair_by_time(true, generated, window_ns, tolerance, origin_ns, backend)
    layouts = _Tables.get(vocab.config, target.device)
    if backend == "kernel" or (backend == "auto" and target.device.type == "cpu" and kernel.available()):
        return _decode_with_kernel(preds, target, vocab, alignment, layouts)
    return _decode_with_torch(preds, target, vocab, alignment, layouts)


def check_pairing(pairing: Pairing, alignment: Alignment, tolerance_ms=None) -> None:
    """Raise if ``pairing`` is unknown or does not apply to ``alignment``, or if a ``tolerance_ms`` is given to a
    pairing that matches nothing by time (it would have no effect)."""
    if pairing not in ("index", "time"):
        raise ValueError(f"pairing must be 'index' or 'time', got {pairing!r}")
    if pairing == "time" and alignment != "generation":
        raise ValueError("pairing='time' matches generated events to true ones: use it with alignment='generation' "
                         "(teacher forcing pairs every position with itself)")
    if tolerance_ms is not None and pairing != "time":
        raise ValueError(f"tolerance_ms={tolerance_ms!r} has no effect with pairing='index' ({alignment}): no event "
                         "is matched by time. Pass alignment='generation', pairing='time' to match within it, or "
                         "leave tolerance_ms out")


def _decode_with_kernel(preds, target, vocab: VocabMap, alignment: Alignment, layouts: "_Tables") -> EventBatch:
    return batch_of_arrays(kernel_arrays(preds, target, vocab, alignment, layouts), layouts.n_ts, target.shape[0],
                           alignment)


def batch_of_arrays(out: dict, n_ts: int, num_sequences: int, alignment: Alignment) -> EventBatch:
    """The `EventBatch` of `kernel_arrays`' output (no copy)."""
    sides = [EventFields(n_timestamp_digits=n_ts, **{k: torch.from_numpy(np.ascontiguousarray(v))
                                                     for k, v in out[side].items()})
             for side in ("target", "pred", "generated") if side in out]
    return EventBatch(seq_idx=torch.from_numpy(out["seq"]), status=torch.from_numpy(out["status"]), target=sides[0],
                      pred=sides[1], target_count=torch.from_numpy(out["target_count"]),
                      pred_count=torch.from_numpy(out["pred_count"]), num_sequences=num_sequences, alignment=alignment,
                      generated=sides[2] if len(sides) > 2 else None,
                      generated_seq=torch.from_numpy(out["generated_seq"]) if "generated_seq" in out else None)


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


def _decode_with_torch(preds, target, vocab: VocabMap, alignment: Alignment, L: "_Tables", pair: bool = True
                       ) -> EventBatch:
    """The torch ops: both sides' token planes (`_token_planes`) in one [P, 2B W] lookup, the spans from dense scans,
    then every row of both sides checked and read at once (`_decode_rows`). One host sync: the number of target
    events (``nonzero``; in generation the numbers of events of both sides, every generated event being decoded).
    Generation without ``pair`` (time pairing matches the sides itself): ``pred`` is the target side again."""
    B, T = target.shape
    generation = alignment == "generation"
    if generation:  # the generated rows under the target rows, padded to one width with ignored labels
        W = max(T, preds.shape[1])
        ids = torch.cat([x if x.shape[1] == W else torch.nn.functional.pad(x, (0, W - x.shape[1]), value=IGNORE_INDEX)
                         for x in (target, preds)])
    else:  # positions ignored in the target are ignored in the prediction
        W = T
        ids = torch.cat([target, torch.where(target < 0, IGNORE_INDEX, preds)])
    table = _token_planes(vocab, L, ids.device)  # a gather along the rows: index_select there is slow on the CPU
    planes = table.gather(1, (ids.clamp(-1, vocab.size) + 1).view(1, -1).expand(len(table), -1))
    scans = _Scans(planes, W)
    target_count, pred_count = scans.marks.sum(1).split([B, B])  # events per row of each side (B = 0 too)
    if generation:  # every span of both sides (the one host sync), the k-th true event of a row paired with its
        # k-th generated event: the generated side decoded whole, the pairs read from it
        # with, per side, the most keyboard type tokens in a row: a bound on its keyboard events (`EventBatch`)
        keys = (planes[_ROLE].view(2, B, W) == int(Role.KEYBOARD)).sum(2)
        if not pair:  # and the most events in a row of each side: the time matching's fixed shapes (`pair_by_time`)
            keys = torch.cat([keys, torch.stack([target_count, pred_count])])
        n, n_g, *bounds = torch.cat([torch.stack([target_count.sum(), pred_count.sum()]),
                                     keys.amax(1) if B else keys.new_zeros(len(keys))]).tolist()
        keyboard_bound, event_bound = bounds[:2], tuple(bounds[2:]) or None
        seq, col = torch.nonzero_static(scans.marks, size=n + n_g).unbind(1)
        first, last, cut, slot0 = scans.spans(torch.add(col, seq, alpha=W))
        status, kind, code, values, digits = _decode_rows(planes, scans.counts, slot0, last, cut, L)
        rows = torch.cat([torch.stack([status, kind, first % W, last % W, code, cut.long()]), L.missing], 1)
        values, digits = torch.cat([values, L.blank], 1), torch.nn.functional.pad(digits, (0, 1), value=-1)
        seq, g_seq = seq[:n], seq[n:] - B
        if pair:
            rank = torch.arange(n, device=seq.device) - (target_count.cumsum(0) - target_count).index_select(0, seq)
            # a target event without its k-th generated one: MISSING, no span (the blank last column)
            paired = torch.where(rank < pred_count.index_select(0, seq),
                                 n + (pred_count.cumsum(0) - pred_count).index_select(0, seq) + rank, n + n_g)
            pick = torch.cat([torch.arange(n, device=seq.device), paired])
        else:
            pick = torch.arange(n, device=seq.device).repeat(2)
        (status_t, status_p), (kind_t, kind_p), (start_t, start_p), (end_t, end_p), (code_t, code_p), cuts = (
            x.split([n, n]) for x in rows.index_select(1, pick))
        cuts = tuple(c.bool() for c in cuts)
        generated = EventFields(*(x[n:n + n_g] for x in (status, kind)), values=values[:, n:n + n_g].t(),
                                digits=digits[:, n:n + n_g].t(), start=first[n:] % W, end=last[n:] % W,
                                start_cut=cut[n:], n_timestamp_digits=L.n_ts)
        values, digits = values.index_select(1, pick), digits.index_select(1, pick)
    else:  # the prediction is read at the target's spans, one side down
        seq, col = scans.marks[:B].nonzero().unbind(1)  # the target spans: the one host sync
        at, n, BW = torch.add(col, seq, alpha=W), seq.numel(), B * W
        generated = g_seq = keyboard_bound = event_bound = None
        pred_count = target_count
        first, last, cut, slot0 = scans.spans(at)
        status, kind, code, values, digits = _decode_rows(planes, scans.counts, torch.cat([slot0, slot0 + BW]),
                                                          torch.cat([last, last + BW]), cut.repeat(2), L)
        start_t = start_p = torch.add(first, seq, alpha=-W)  # in the row
        end_t = end_p = torch.add(last, seq, alpha=-W)
        cuts = (cut, cut)
        (status_t, status_p), (kind_t, kind_p), (code_t, code_p) = (x.split([n, n]) for x in (status, kind, code))
    values, digits = (x.t().split([n, n]) for x in (values, digits))  # [n, columns] per side
    tgt = EventFields(status=status_t, kind=kind_t, values=values[0], digits=digits[0], start=start_t, end=end_t,
                      start_cut=cuts[0], n_timestamp_digits=L.n_ts)
    pred = EventFields(status=status_p, kind=kind_p, values=values[1], digits=digits[1], start=start_p, end=end_p,
                       start_cut=cuts[1], n_timestamp_digits=L.n_ts)
    status = L.pair_status[generation].index_select(0, torch.add(code_p, code_t, alpha=L.n_codes))
    return EventBatch(seq_idx=seq, status=status, target=tgt, pred=pred, target_count=target_count,
                      pred_count=pred_count, num_sequences=B, alignment=alignment, generated=generated,
                      generated_seq=g_seq, keyboard_bound=None if keyboard_bound is None else tuple(keyboard_bound),
                      event_bound=event_bound)


class _Scans:
    """Where the event spans of rows of width W are, from prefix scans of their token planes [P, R W] (no host sync).

    A span opens at every ``<EVENT_START>`` and at every ``<EVENT_END>`` with no start since the previous end (its
    start was cut off: the first target event after the teacher-forcing shift); ``marks`` [R, W] flags them.
    A struct token is encoded as ``here = 2 pos + (1 if start)`` (-2: none; ``before``: the last one before it in its
    row). Per flat position, ``info`` [3, R W] holds ``S2`` (at a struct token: 1 a start, 0 an end), the flat
    position after the struct token before it (or the row start) and the row's last kept token (not ignored /
    episode: trailing ones are padding); ``counts`` [3, R W] the running numbers of struct and kept tokens and the
    tail weights through it, whose searches find the next ones.
    """

    def __init__(self, planes: torch.Tensor, W: int):
        R = planes.shape[1] // W
        pos2, pos1, row_before, row_after = _row_constants(R, W, planes.device)  # row_before: [R, W]
        runs = planes[_STRUCT:]
        self.counts = runs.cumsum(1, dtype=torch.int32)  # int32 throughout: half the bytes of int64
        self.kept_before = (self.counts - runs)[1]
        s2, struct, kept = planes.view(len(planes), R, W).unbind(0)[_S2:_TAIL]
        here = torch.addcmul(s2, struct, pos2)
        before = torch.nn.functional.pad(here.cummax(1).values[:, :-1], (1, 0), value=-2)
        self.marks = struct & (~before | here)  # a start, or an end whose previous is no start
        row_last = (kept * pos1).amax(1, keepdim=True) + row_before
        self.info = torch.stack([s2, (before >> 1) + row_after, row_last]).view(3, -1)

    def spans(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(first, last, cut, slot0)`` flat positions of the spans marked at flat positions ``at``, with the
        position of their ``<EVENT_START>`` (one before ``first`` when it was cut off)."""
        start, after, row_last = self.info.index_select(1, at).unbind(0)
        structs, kept, _ = self.counts.unbind(0)
        # the k-th struct / kept token is where the running count first exceeds k - 1
        nxt = torch.searchsorted(structs, structs.index_select(0, at), right=True)  # the next struct (maybe a later row)
        # cut by the next start (before it), closed by the next end, or cut by the row's last kept token (also when no
        # struct token follows: nxt is then past the row)
        last = torch.minimum(row_last, nxt - self.info[0].index_select(0, nxt.clamp(max=len(structs) - 1)))
        cut = start == 0  # a cut-off span starts at the first kept token after the previous end (or row start)
        first = torch.searchsorted(kept, self.kept_before.index_select(0, after), right=True)
        return torch.where(cut, first, at), torch.where(cut, at, last), cut, torch.where(cut, first - 1, at)


@functools.lru_cache(maxsize=4)  # the last few batch shapes: R x W int32 each (16 MB at 64 x 65536)
def _row_constants(R: int, W: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(2 pos, pos + 1, row start - 1, row start + 1)`` of rows [R, W]: pos [W], the flat row starts (- 1 at every
    position [R, W]: a sum with it needs no expand, + 1 [R, 1]); cached (no copy to a GPU per update)."""
    pos, row_start = torch.arange(W, device=device), torch.arange(R, device=device)[:, None] * W
    return tuple(x.int() for x in (2 * pos, pos + 1, (row_start - 1).expand(R, W).contiguous(), row_start + 1))


# rows of `_token_planes`: those read in an event's window, then those scanned (running counts)
_VALUE, _VERDICTS, _ROLE, _S2, _STRUCT, _KEPT, _TAIL = range(7)
_PLANES: "weakref.WeakKeyDictionary[VocabMap, dict]" = weakref.WeakKeyDictionary()


def _token_planes(vocab: VocabMap, L: "_Tables", device) -> torch.Tensor:
    """[7, vocab.size + 2] int32, indexed like `VocabMap.codes` (id + 1, clamped): per token its value (-1: none),
    its verdicts (2 bits per rule of ``L.rule_values``: 0 accepted, else the status of a slot that rejects it),
    role, ``S2`` (1 a start, 0 an end, -2 no struct token), then 0/1 struct, 0/1 kept (not ignored / episode) and
    the tail weight (0 image token or ignored label, 1 ``<EVENT_END>``, 3 any other). Cached per vocabulary and device."""
    cache = _PLANES.setdefault(vocab, {})
    device = torch.device(device)
    if device not in cache:
        code = vocab.codes_table.long()
        role, value = code & ROLE_MASK, (code >> VALUE_SHIFT) - 1
        struct, skip, image = (code & STRUCT_BIT) != 0, (code & SKIP_BIT) != 0, (code & IMAGE_BIT) != 0
        missing = torch.where((role == int(Role.END)) | (role == int(Role.IGNORED)), int(Status.MISSING_FIELDS),
                              int(Status.INVALID_FORMAT))  # where a field was expected
        verdicts = torch.zeros_like(code)
        for k, rule in enumerate(L.rule_values):
            accepted = ((rule >> role) & 1 == 1) & (value < (rule >> 16))
            rejected = missing if rule != 0 else int(Status.INVALID_FORMAT)  # rule 0: the slot after <EVENT_END>
            verdicts |= torch.where(accepted, 0, rejected) << (2 * k)
        s2 = torch.where(struct, (role == int(Role.START)).long(), -2)
        tail = torch.where(image, 0, torch.where(role == int(Role.END), 1, 3))
        planes = torch.stack([value, verdicts, role, s2, struct.long(), (~skip).long(), tail])
        cache[device] = planes.to(device, torch.int32)  # half the bytes of int64 to gather
    return cache[device]


class _Tables:
    """The format's layouts (`TokenFormat`) as tensors, one row per layout.

    ``rules`` [layouts, width]: per slot from ``<EVENT_START>``, the accepted roles (bit mask, low 16 bits) and
    the value bound (<< 16); a run layout (screen) stops before its image run, which is checked with a count.
    ``place`` [2 * layouts * F, window]: place values times the field's unit (ns, scroll steps), then sign selectors,
    so that one matrix product reads every field of every layout in its unit; ``modulus`` [layouts, F];
    ``digit_slots`` [layouts, D]: the slot of each digit-precision level (-1: the layout has none); ``by_key``: an
    event's columns for the torch ops (`_decode_rows`).
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
        rules = [[a | (b or MAX_BOUND) << 16 for a, b in (r + anything)[:self.width]] for r in slot_rules]
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
        data = [(1 << int(Role.IMAGE)) | (1 << int(Role.IGNORED)) | MAX_BOUND << 16]
        window_rules = [(row[:len(r)] + (data if run >= 0 else [0]) + row[len(r):])[:self.window]
                        for row, r, run in zip(rules, slot_rules, runs)]
        checked = [len(r) + (run >= 0) for r, run in zip(slot_rules, runs)]  # slots whose failure is a status
        # the torch ops (`_decode_rows`) read an event's columns by its key: ((the role of its type token, NO_ROLE for a
        # span of one token) x 2 + whether the variant's token is there) x 2 + whether its start was cut off
        self.offsets = torch.arange(self.window, device=device)[:, None]
        self.offsets4 = 4 * self.offsets
        anything = 0xFFFF | MAX_BOUND << 16  # slot 0 of a cut-off start
        # at most MAX_RULES rules and one extended layout: `TokenFormat` checks it when the table is built
        self.rule_values = sorted({rule for row in window_rules for rule in row} | {anything})
        self.variant = self.variants[0][2:] if self.variants else (0, -1)  # (slot, role): never seen without one
        self.bf = FIELDS.index("button_flags")  # an unsigned field of mouse events (checked by `TokenFormat`)
        # the torch ops read each field in its unit (ns, scroll steps): place values and moduli times the unit
        units = torch.tensor([self.unit_ns if f == "timestamp" else self.scroll_unit if f == "scroll" else 1
                              for f in FIELDS])
        place_in_units = torch.stack([place[0] * units[:, None], place[1]])
        modulus_in_units = self.modulus.cpu() * units
        half = torch.where(modulus_in_units > 0, modulus_in_units // 2, 1 << 62).tolist()
        # float32 reads every field exactly (token values below the largest bound)
        top = max(s.bound for lay in fmt.layouts for s in lay.slots)
        exact32 = float(place_in_units.abs().sum(-1).max()) * top < 2 ** 24
        columns = []
        for key in range(4 * _N_ROLES):
            role, variant, cut = key // 4, key // 2 % 2, key % 2
            kind = role - int(Role.KEYBOARD) if int(Role.KEYBOARD) <= role <= int(Role.SCREEN) else -1
            lay = fmt.layout_index(Kind(max(kind, 0)).name.lower())  # kind -1 reads as keyboard
            if variant and self.variants and lay == self.variants[0][0]:
                lay = self.variants[0][1]
            shifts = [2 * self.rule_values.index(rule) for rule in window_rules[lay]]
            shifts[0] = 2 * self.rule_values.index(anything) if cut else shifts[0]
            data_start = runs[lay] if runs[lay] >= 0 else checked[lay] - 1  # a run, or the <EVENT_END> slot
            slots = [s if s >= 0 else 1 for s in digit_slots[lay].tolist()]  # slot 1 of a valid event reads -1
            columns.append(shifts + [checked[lay] - 1, data_start - 1, kind, int(KIND_CATEGORY[max(kind, 0)]), lay * n_f,
                                     kind + 1] + modulus_in_units[lay].tolist() + half[lay] + slots
                           + [0 if sign else 1 for sign in self.digit_sign[lay].tolist()])
        self.by_key = torch.tensor(columns, device=device)  # [keys, columns]: rows copied whole by index_select
        n_d = self.digit_slots.shape[1]
        self.key_rows = (self.window, 6, n_f, n_f, n_d, n_d)
        # [2 layouts F, window]: place values, then sign selectors, so that one product reads every field of every
        # layout; an event's rows: field_rows + its layout x F
        self.place = torch.nn.functional.pad(place_in_units.view(2 * n_lay * n_f, self.width), (0, 1)).to(
            device, torch.float32 if exact32 else torch.float64)
        self.field_rows = torch.tensor([side * n_lay * n_f + f for side in (0, 1) for f in range(n_f)],
                                       device=device)[:, None]
        # a span's status by (4 j + status of its first rejected slot, whether it ends before its checked slots, its
        # tail weight clamped at 2): the rejected slot's status, else truncated, else by the weight: data cut, closed,
        # invalid
        by_weight = [int(Status.TRUNCATED), int(Status.VALID), int(Status.INVALID_FORMAT)]
        self.span_status = torch.tensor([rejected & 3 or (int(Status.TRUNCATED) if short else by_weight[weight])
                                         for rejected in range(4 * self.window + 1) for short in (0, 1)
                                         for weight in range(3)], device=device)
        self.blank = torch.tensor([int(Category.INVALID)] + [0] * 7, device=device)[:, None]  # a row that does not decode
        # an event's status and kind in one code, status x K + kind + 1 (K = `KIND_CODES`); a pair's status by the
        # codes of its two sides
        self.n_codes = KIND_CODES * len(Status)
        self.missing = torch.tensor([int(Status.MISSING), -1, -1, -1, KIND_CODES * int(Status.MISSING), 0],
                                    device=device)[:, None]  # status, kind, span, code, cut of no predicted event
        self.pair_status = [torch.tensor(_pair_statuses(generation), device=device) for generation in (False, True)]
        self.no_role = torch.tensor([_N_ROLES - 1], device=device)  # the key's role of a span of one token

    @classmethod
    def get(cls, config: CodecConfig, device) -> "_Tables":
        key = (config, torch.device(device))
        if key not in cls._cache:
            cls._cache[key] = cls(config, device)
        return cls._cache[key]


def _pair_statuses(generation: bool) -> list[int]:
    """A pair's comparison status (`EventBatch.status`) by the codes ``(status x K + kind + 1)`` of its target and
    predicted event, ``target code x K len(Status) + predicted code``: INVALID_TARGET where the target does not decode,
    else TYPE_MISMATCH where the prediction's type token names another kind (in generation only if it decodes; under
    teacher forcing whatever the data tokens after it), else the prediction's own status."""
    out = []
    for status_t, kind_t, status_p, kind_p in itertools.product(range(len(Status)), range(-1, len(Kind)), repeat=2):
        decided = status_p == Status.VALID if generation else kind_p >= 0
        out.append(Status.INVALID_TARGET if status_t != Status.VALID else
                   Status.TYPE_MISMATCH if decided and kind_p != kind_t else status_p)
    return out


def _decode_rows(planes: torch.Tensor, counts: torch.Tensor, slot0: torch.Tensor, last: torch.Tensor, cut: torch.Tensor,
                 L: _Tables, present: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check and read the events whose ``<EVENT_START>`` is at flat position ``slot0`` (virtual when ``cut`` off) and
    whose last token is at ``last``, in the token planes [P, R W] (`_token_planes`) and their running ``counts``:
    ``(status, kind, code, values [8, N], digits [D, N])`` (code: status x K + kind + 1, see `_pair_statuses`),
    values and digits blank where the row does not decode or, in the last ``len(present)`` rows, is not ``present``.

    Works slot-major: the window planes are [width, N] (slot j of every event in row j).
    """
    n = slot0.numel()
    window = planes[:_S2].gather(1, (slot0 + L.offsets).clamp(0, planes.shape[1] - 1).view(1, -1).expand(_S2, -1))
    value, verdicts, role = window.view(_S2, L.window, n).unbind(0)
    span = last - slot0  # the span's tokens after slot 0
    # the event's key (`_Tables`): its type token's role, the extended layout's token, a cut-off start. The extended
    # layout's token may lie past the span: the event is then truncated in both layouts, which agree up to it
    at, var_role = L.variant
    type_role = torch.where(span > 0, role[1], L.no_role)  # int64 (an index)
    key = torch.add(cut, torch.add(role[at] == var_role, type_role, alpha=2), alpha=2)
    shifts, singles, modulus, half, slots, unsigned = L.by_key.index_select(0, key).t().split(L.key_rows)
    # checked: the slots whose failure is a status, - 1; fields_at: the event layout's first row of ``L.place``;
    # kind_code: kind + 1
    checked, data_before, kind, kind_category, fields_at, kind_code = singles.unbind(0)

    # slot by slot: the first slot within the span whose token its rule rejects (4 j + its status; 4 width: none)
    verdict = ((verdicts >> shifts) & 3) * (L.offsets <= span)
    first_rejected = torch.where(verdict > 0, L.offsets4 + verdict, 4 * L.window).amin(0)
    # the data (a run, else the <EVENT_END> slot) through the span's last token: image tokens or ignored labels then
    # <EVENT_END> weigh 1 (closed), none 0 (the data was cut: truncated), any other token more (invalid)
    tails = counts[2]
    weight = tails.index_select(0, last) - tails.index_select(0, (slot0 + data_before).clamp(0, len(tails) - 1))
    status = L.span_status.index_select(0, torch.add(torch.add(weight.clamp(0, 2), span < checked, alpha=3),
                                                     first_rejected, alpha=6))
    ok = status == int(Status.VALID)
    if present is not None:
        ok[n - len(present):] &= present

    # every field of every layout in one product, then each event's layout: (-1)^minus * sum(value * place)
    per_layout = L.place @ value.to(L.place.dtype)  # [2 layouts F, N]: place values, then sign selectors
    magnitude, minus = per_layout.gather(0, L.field_rows + fields_at).split(len(FIELDS))
    number = torch.addcmul(magnitude, magnitude, minus, value=-2).long()  # exact integers
    number = number - modulus * (number >= half)  # a field read modulo its range: the upper half is negative
    category = kind_category - number[L.bf].clamp(max=1)  # a mouse event with button flags is a mouse op
    values = torch.where(ok, torch.cat([category[None], number]), L.blank)
    # a sign level reads as + when its field is 0 (<SIGN_MINUS><0>... is the number 0, written <SIGN_PLUS>...)
    digits = value.gather(0, slots).masked_fill_((magnitude.index_select(0, L.digit_field) + unsigned) == 0, 0)
    return status, kind, torch.add(kind_code, status, alpha=KIND_CODES), values, torch.where(ok, digits, -1)
