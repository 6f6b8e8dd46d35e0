"""`OWAEventMetrics`' arguments, checked: one function per group (the vocabulary, alignment and pairing, tags, the D2E
protocol, an update's inputs), each raising an error that says what to pass instead."""

from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch

from ..decode.batch import check_pairing
from ..decode.event_batch import Alignment, EventBatch
from ..decode.matching import DEFAULT_TOLERANCE_MS, tolerance_ns
from ..functional.d2e import DEFAULT_BIN_MS, bin_ns_of
from ..tokens.codec import CodecConfig
from ..tokens.vocab import VocabMap

MAX_TAGS = 64  # every state has a row per tag: sketch mode ~0.7 MB per tag; exact mode keeps each sample once


# ------------------------------------------------------------------------------------------ the constructor's
def vocab_map(vocab, config: Optional[CodecConfig], format: Optional[str]) -> VocabMap:
    """A `VocabMap` as given, or one read from a tokenizer (`VocabMap.from_tokenizer`)."""
    if vocab is None:
        raise ValueError("OWAEventMetrics needs the model's tokenizer (with the event tokens) or vocab=VocabMap")
    return vocab if isinstance(vocab, VocabMap) else VocabMap.from_tokenizer(vocab, config, format)


def check_alignment(alignment, mode, backend, pairing, tolerance_ms, generated_screens, window_ns: int) -> tuple:
    """How the metric reads and pairs the events, checked: ``(tolerance_ns, sweep, tolerance_ms)``: the tolerance
    (sweep) in ns to compare (None unless ``pairing="time"``, where it defaults to `DEFAULT_TOLERANCE_MS`), the
    sweep's tolerances (ms; () for one) and the ``tolerance_ms`` the metric keeps (a sweep as a tuple)."""
    if alignment not in ("teacher_forcing", "generation"):
        raise ValueError(f"alignment must be 'teacher_forcing' or 'generation', got {alignment!r}")
    if mode not in ("exact", "sketch"):
        raise ValueError(f"mode must be 'exact' or 'sketch', got {mode!r}")
    if backend not in ("auto", "kernel", "torch"):
        raise ValueError(f"backend must be 'auto' (the CPU kernel for CPU tensors, else torch ops), 'kernel' or "
                         f"'torch', got {backend!r}")
    check_pairing(pairing, alignment, tolerance_ms)  # a tolerance_ms needs pairing="time"
    if generated_screens not in ("context", "scored"):
        raise ValueError(f"generated_screens must be 'context' (screens are what the model is shown: left out of "
                         f"the pairing and every key) or 'scored' (a model that predicts screen timing), got "
                         f"{generated_screens!r}")
    in_ns = None
    if pairing == "time":  # the tolerance checked (raises saying what is allowed), kept in ns to compare
        tolerance_ms = DEFAULT_TOLERANCE_MS if tolerance_ms is None else tolerance_ms
        in_ns = tolerance_ns(tolerance_ms, window_ns)
    sweep = tuple(tolerance_ms) if isinstance(tolerance_ms, (tuple, list)) else ()
    return in_ns, sweep, sweep or tolerance_ms


def check_tags(tags) -> tuple[str, ...]:
    """The tags' names, checked: distinct non-empty printable strings without ``/`` (they name keys and table rows: a
    line break or other control character would split them), at most `MAX_TAGS`."""
    if tags is None:
        return ()
    if isinstance(tags, str) or not all(is_tag_name(t) for t in tags) or not tags:
        raise ValueError(f"tags must be a list of names (non-empty printable strings without '/': no line break, "
                         f"tab or other control character), got {tags!r}")
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags must be distinct names, got {list(tags)}")
    if len(tags) > MAX_TAGS:
        raise ValueError(f"{len(tags)} tags: at most {MAX_TAGS} (each tag keeps its own row of every state, ~0.7 MB "
                         "in sketch mode); group rare tags into one (e.g. 'other')"
                         " or slice by a coarser label")
    return tuple(tags)


def is_tag_name(name) -> bool:
    """Whether ``name`` can name a tag: a non-empty printable string without ``/`` (`str.isprintable`)."""
    return isinstance(name, str) and bool(name) and "/" not in name and name.isprintable()


def check_tag_keys(tag_keys):
    """``None`` (the headline keys and the counts), ``"all"``, or key names."""
    if tag_keys is None or tag_keys == "all":
        return tag_keys
    if isinstance(tag_keys, str) or not tag_keys or not all(isinstance(k, str) for k in tag_keys):
        raise ValueError(f"tag_keys must be None (the headline keys and the counts), 'all' or a list of report keys, "
                         f"got {tag_keys!r}")
    return tuple(tag_keys)


def check_d2e(bin_ms, empty_bins_as_correct, bin_shifts, alignment: Alignment) -> tuple:
    """``(bin_ms, bin_shifts, empty_bins_as_correct)`` of the D2E protocol, checked (shifts without bins refused);
    ``bin_ms="auto"``: `DEFAULT_BIN_MS` in generation, None (off) under teacher forcing."""
    if isinstance(bin_ms, str) and bin_ms == "auto":
        bin_ms = DEFAULT_BIN_MS if alignment == "generation" else None
    if bin_ms is None:
        if tuple(bin_shifts) or empty_bins_as_correct:
            raise ValueError("bin_shifts / empty_bins_as_correct belong to the D2E protocol: pass bin_ms too "
                             "(upstream's is 50)")
        return None, (), False
    bin_ns_of(bin_ms)
    whole = lambda k: isinstance(k, (int, np.integer)) and not isinstance(k, bool)  # noqa: E731
    if isinstance(bin_shifts, (str, bytes)) or not hasattr(bin_shifts, "__iter__") or not all(map(whole, bin_shifts)):
        raise ValueError(f"bin_shifts must be whole numbers of bins, e.g. range(-3, 4), got {bin_shifts!r}")
    return float(bin_ms), tuple(int(k) for k in bin_shifts), bool(empty_bins_as_correct)


# ------------------------------------------------------------------------------------------ an update's
def check_origin(origin_ns, pairing: str) -> None:
    """``origin_ns`` belongs to time pairing."""
    if origin_ns is not None and pairing != "time":
        raise ValueError("origin_ns is the time origin of pairing='time': build OWAEventMetrics(..., "
                         "alignment='generation', pairing='time') to use it")


def check_event_batch(batch: EventBatch, token_inputs: tuple, tags, tagged: bool, pairing: str,
                      tolerance: Union[None, int, tuple], tolerance_ms) -> None:
    """``update(batch)`` alone: no ``token_inputs`` (target, logits, token loss) nor tags (``tagged``: the metric
    has tags), and paired as the metric pairs (by time: at its ``tolerance``, ns, given as ``tolerance_ms``)."""
    if tags is not None or tagged:
        raise ValueError("tags slice the token ids: pass update(preds_ids, target_ids, tags=...) rather than "
                         "an EventBatch")
    if any(x is not None for x in token_inputs):
        raise ValueError("update(EventBatch) takes the decoded batch alone: the token accuracy and loss need "
                         "the token ids, so pass update(preds_ids, target_ids, logits=...) instead")
    if (batch.time_matching is not None) != (pairing == "time"):
        raise ValueError(f"this EventBatch was paired by {'time' if batch.time_matching else 'index'} but "
                         f"the metric pairs by {pairing}: decode with decode_batch(..., "
                         f"pairing='{pairing}') or build the metric with the batch's pairing")
    found = batch.time_matching  # the tolerance (sweep) it was matched at must be the metric's
    if found is not None and (found.sweep_ns or found.tolerance_ns) != tolerance:
        raise ValueError(f"this EventBatch was matched at {_said_ms(found.sweep_ns or found.tolerance_ns)} "
                         f"but the metric at {_said_ms(tolerance)}: decode with decode_batch(..., "
                         f"pairing='time', tolerance_ms={tolerance_ms}), or build the metric with the "
                         "batch's tolerance")


def _said_ms(tolerance_ns: Union[int, tuple]) -> str:
    """A tolerance (ns) or a sweep of them in words: ``tolerance 100 ms``, ``tolerance sweep (50, 100) ms``."""
    if isinstance(tolerance_ns, tuple):
        return f"tolerance sweep ({', '.join(f'{t / 1e6:g}' for t in tolerance_ns)}) ms"
    return f"tolerance {tolerance_ns / 1e6:g} ms"


def check_token_inputs(target, logits, token_loss, alignment: Alignment) -> None:
    """``update(preds, target, logits= | token_loss=)``: a target, and at most one of the loss inputs, each aligned
    with ``target`` on its device (teacher forcing)."""
    if target is None:
        raise ValueError("update(preds, target): target token ids are missing")
    if logits is not None and token_loss is not None:
        raise ValueError("pass logits= or token_loss= (the loss they give), not both")
    if logits is not None:
        _check_logits(logits, target, alignment)
    if token_loss is not None:
        _check_token_loss(token_loss, target, alignment)


def _check_logits(logits, target, alignment: Alignment) -> None:
    """Raise unless ``logits`` are floating [B, T, V > 0] aligned with ``target`` on its device (teacher forcing)."""
    if alignment != "teacher_forcing":
        raise ValueError("logits give the token loss under teacher forcing only; with alignment='generation' "
                         "pass the generated ids and the target ids alone")
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor [B, T, V], got "
                        f"{getattr(logits, 'dtype', type(logits).__name__)}")
    shape = tuple(getattr(target, "shape", ()))
    if tuple(logits.shape[:-1]) != shape or logits.shape[-1] == 0:
        raise ValueError(f"logits {tuple(logits.shape)} must be [B, T, V] (V > 0: the vocabulary) aligned with "
                         f"target {shape}")
    if isinstance(target, torch.Tensor) and logits.device != target.device:
        raise ValueError(f"logits on {logits.device} and target on {target.device}: put the logits on the ids' device")


def _check_token_loss(token_loss, target, alignment: Alignment) -> None:
    """Raise unless ``token_loss`` is a floating [B, T] aligned with ``target`` on its device (teacher forcing)."""
    if alignment != "teacher_forcing":
        raise ValueError("token_loss gives the token loss under teacher forcing only; with alignment='generation' "
                         "pass the generated ids and the target ids alone")
    shape = tuple(getattr(target, "shape", ()))
    if not isinstance(token_loss, torch.Tensor) or not token_loss.is_floating_point() or tuple(token_loss.shape) != shape:
        raise ValueError(f"token_loss {tuple(getattr(token_loss, 'shape', ()))} / {getattr(token_loss, 'dtype', None)} "
                         f"must be a float tensor [B, T] aligned with target {shape}")
    if isinstance(target, torch.Tensor) and token_loss.device != target.device:
        raise ValueError(f"token_loss on {token_loss.device} and target on {target.device}: put it on the ids' device")


def tag_ids(tags, names: tuple[str, ...], batch_size: int, device) -> Optional[torch.Tensor]:
    """``update(..., tags=)``: each sequence's tag id [B] on ``device`` (``names``: the metric's tags; None without
    tags; one host read of the ids); raises on misuse."""
    if tags is None or not names:
        if tags is not None:
            raise ValueError("update(..., tags=) needs the tags' names up front: OWAEventMetrics(..., "
                             "tags=['minecraft', 'vscode', ...])")
        if names:
            raise ValueError(f"this metric reports per tag ({len(names)} tags): pass update(..., tags=) with "
                             "one tag per sequence (ids into tags, or the names), in every update")
        return None
    if isinstance(tags, (list, tuple, np.ndarray)) and all(isinstance(t, str) for t in tags):  # or empty
        index = {name: i for i, name in enumerate(names)}
        unknown = sorted(set(tags) - index.keys())
        if unknown:
            raise ValueError(f"tags {unknown} are not among this metric's tags {names}: name every tag "
                             "of the data in OWAEventMetrics(..., tags=)")
        tags = torch.tensor([index[t] for t in tags], dtype=torch.long)  # [] too: no ids, no float
    try:
        ids = torch.as_tensor(tags).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        ids = None
    if ids is None or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool or \
            ids.numel() != batch_size:
        raise ValueError(f"tags must be {batch_size} integer ids (one per sequence) or names, got {tags!r}"[:300])
    ids = ids.cpu().long()
    if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < len(names):
        raise ValueError(f"tag ids must be in [0, {len(names)}) (indices into tags={names}), got "
                         f"{sorted(set(ids.tolist()))}")
    return ids.to(device)
