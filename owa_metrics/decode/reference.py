"""The per-event string path: the readable reference the batch decoder is tested and benchmarked against.

Token ids -> token strings (``VocabMap.token``) -> `EventCodec` spans and cursor decoding, one event at a
time in Python. Slow by design; never use it in a training loop.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..schema import Category, Event, Kind, Status
from ..tokens.codec import EventCodec, EventDecodeError
from ..tokens.vocab import VocabMap

_KINDS = {"keyboard": int(Kind.KEYBOARD), "mouse": int(Kind.MOUSE), "screen": int(Kind.SCREEN)}


def reference_decode(preds: Sequence[Sequence[int]], target: Sequence[Sequence[int]], vocab: VocabMap,
                     alignment: str = "teacher_forcing") -> list[dict]:
    """One dict per target event: ``seq``, ``status`` and the ``target`` / ``pred`` field dicts."""
    codec = EventCodec(vocab.config)
    rows = []
    for b, (p_ids, t_ids) in enumerate(zip(preds, target)):
        t_tokens = [vocab.token(int(i)) for i in t_ids]
        p_tokens = [vocab.token(int(i)) for i in p_ids]
        if alignment == "teacher_forcing":
            p_tokens = [None if t is None else p for p, t in zip(p_tokens, t_tokens)]
            pairs = [(span, span) for span in codec.spans(t_tokens)]
        else:
            p_spans = codec.spans(p_tokens)
            pairs = [(span, p_spans[k] if k < len(p_spans) else None) for k, span in enumerate(codec.spans(t_tokens))]
        for t_span, p_span in pairs:
            tgt = _side(codec, t_tokens, t_span)
            pred = _side(codec, p_tokens, p_span) if p_span else _missing(codec)
            typed = pred["status"] == Status.VALID or (alignment == "teacher_forcing" and pred["kind"] >= 0)
            if tgt["status"] != Status.VALID:
                status = Status.INVALID_TARGET
            elif typed and pred["kind"] != tgt["kind"]:
                status = Status.TYPE_MISMATCH
            else:
                status = pred["status"]
            rows.append({"seq": b, "status": status, "target": tgt, "pred": pred})
    return rows


def _side(codec: EventCodec, tokens: list[Optional[str]], span: tuple[int, int, bool]) -> dict:
    first, last, cut = span
    event_tokens = ([codec.config.event_start] if cut else []) + tokens[first:last + 1]
    kind = _KINDS.get(codec.kind_of(event_tokens[1]) if len(event_tokens) > 1 else None, -1)
    try:
        event = codec.decode_tokens(event_tokens)
    except EventDecodeError as err:
        return {**_missing(codec), "status": err.status, "kind": kind, "start": first, "end": last, "start_cut": cut}
    return {**event_fields(codec, event), "status": Status.VALID, "kind": kind, "start": first, "end": last,
            "start_cut": cut}


def event_fields(codec: EventCodec, event: Event) -> dict:
    """The batch decoder's per-row fields of one valid event (0 for fields its kind does not use)."""
    n_delta = codec.format.digit_columns.count("dx")
    mouse = event.kind == "mouse"
    digits = codec.digits(event)
    return {
        "category": int(event.category),
        "timestamp_ns": event.timestamp_ns,
        "vk": event.vk or 0,
        "action": int(event.action == "release"),
        "dx": event.dx or 0, "dy": event.dy or 0,
        "button_flags": event.button_flags or 0, "button_data": event.button_data or 0,
        "timestamp_digits": digits["timestamp"],
        "dx_digits": digits["dx"] if mouse else [-1] * n_delta,
        "dy_digits": digits["dy"] if mouse else [-1] * n_delta,
    }


def _missing(codec: EventCodec) -> dict:
    columns = codec.format.digit_columns
    return {
        "status": Status.MISSING, "kind": -1, "category": int(Category.INVALID), "timestamp_ns": 0, "vk": 0,
        "action": 0, "dx": 0, "dy": 0, "button_flags": 0, "button_data": 0,
        **{f"{name}_digits": [-1] * columns.count(name) for name in ("timestamp", "dx", "dy")}, "start": -1, "end": -1, "start_cut": False,
    }
