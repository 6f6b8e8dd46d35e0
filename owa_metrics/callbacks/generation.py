"""Generation for the callback: cut each validation sequence into a prompt and its last events, let the model
continue the prompt, and return what it generated next to the true continuation."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from ..decode.batch import decode_batch
from ..schema import Status
from ..tokens.vocab import Role, VocabMap

GENERATE_NEEDS = ("generate_fn(input_ids, attention_mask, max_new_tokens) must return the prompt followed by the "
                  "generated ids, as HF generate does: an integer tensor [batch, prompt_len + new] or a list of id "
                  "lists (one per prompt row); give it keyword arguments batch= and cut= (or **kwargs) to receive the "
                  "validation batch and each prompt's length in it")
PROMPT_KEYS = ("input_ids", "attention_mask", "labels", "tag")  # what the prompt replaces, the tag: never generate's


def check_batch(batch: Any) -> None:
    """Raise now, naming what is missing, if generation could not read this batch."""
    if not (isinstance(batch, Mapping) and "input_ids" in batch):
        raise RuntimeError("OWAEventMetricsCallback (generation) reads the prompt from batch['input_ids'] (and "
                           "the targets from batch['labels'] when present); the batch has no 'input_ids'")


def generate_batch(pl_module, batch: Any, batch_idx: int, tokenizer, vocab: VocabMap, generate_fn: Optional[Callable],
                   *, rows: int, predict_events: int, max_new_tokens: Optional[int], time_origin: bool):
    """``(generated, target, origin_ns)`` for the first ``rows`` sequences of ``batch``: generated ids [B, N]
    (the prompt removed, padding as -100), the true continuation [B, T] and, with ``time_origin``, each row's
    time origin (`last_event_ns`; else None)."""
    check_batch(batch)
    ids = batch["input_ids"]
    labels = batch.get("labels", ids)
    ids, labels = ids[:rows], labels[:rows]
    prompt, mask, target, cut = split_prompt(ids, labels, vocab, predict_events)
    generate = generate_fn or default_generate(pl_module, tokenizer)
    max_new = max_new_tokens or predict_events * 80
    context = {name: value for name, value in (("batch", batch), ("cut", cut)) if name in _keywords(generate)}
    with torch.no_grad():
        try:
            generated = as_ids(generate(prompt, mask, max_new, **context), prompt.device)[:, prompt.shape[1]:]
        except PromptInputsError:
            raise
        except Exception as err:
            raise RuntimeError(f"OWAEventMetricsCallback: generate_fn failed at validation batch {batch_idx} "
                               f"({type(err).__name__}: {err}). {GENERATE_NEEDS}") from err
    pad = tokenizer.pad_token_id
    if pad is not None:
        generated = torch.where(generated == pad, -100, generated)
    origin = last_event_ns(prompt, mask, vocab) if time_origin else None
    return generated, target, origin


def as_ids(out: Any, device) -> torch.Tensor:
    """A generate_fn's output as ids [B, T]: a tensor, or a list of id lists (ragged rows padded with -100)."""
    if isinstance(out, torch.Tensor) and out.dim() == 2 and not out.is_floating_point():
        return out.to(device)
    if isinstance(out, (list, tuple)) and all(isinstance(row, (list, tuple, torch.Tensor)) for row in out):
        rows = [torch.as_tensor(row, dtype=torch.long).reshape(-1) for row in out]
        width = max((r.numel() for r in rows), default=0)
        return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel()), value=-100) for r in rows]).to(device)
    raise TypeError(f"got {type(out).__name__}" + (f" of shape {tuple(out.shape)} / {out.dtype}"
                                                   if isinstance(out, torch.Tensor) else ""))


def split_prompt(ids: torch.Tensor, labels: torch.Tensor, vocab, predict_events: int):
    """``(prompt, mask, target, cut)``: prompt = each row up to the start of its last ``predict_events`` events,
    keeping at least its first event (left-padded, with a mask), ``ids[b, :cut[b]]``; target = the rest of the
    row's labels (left-aligned, -100 padded)."""
    B, T = ids.shape
    starts = (vocab.codes(ids) & 0xF) == int(Role.START)
    count = starts.sum(1)
    keep_events = torch.maximum(count - predict_events, count.clamp(max=1))  # keep one event as context
    rank = starts.long().cumsum(1)
    is_cut = starts & (rank == (keep_events + 1)[:, None])
    cut = torch.where(is_cut.any(1), is_cut.long().argmax(1), torch.full_like(count, T))
    width = max(int(cut.max()), 1)
    pos = torch.arange(width, device=ids.device) - (width - cut)[:, None]
    mask = pos >= 0
    prompt = torch.where(mask, ids.gather(1, pos.clamp(min=0)), 0)
    tail = torch.arange(T, device=ids.device) + cut[:, None]
    target = torch.where(tail < T, labels.gather(1, tail.clamp(max=T - 1)), -100)
    return prompt, mask.long(), target, cut


def last_event_ns(prompt: torch.Tensor, mask: torch.Tensor, vocab) -> torch.Tensor:
    """[B]: the timestamp (ns, within the window) of each prompt row's last valid event, -1 for none: the time
    origin of ``pairing="time"``."""
    ids = torch.where(mask.bool(), prompt, -100)
    batch = decode_batch(ids, ids, vocab, "teacher_forcing")
    events = batch.target
    valid = (events.status == int(Status.VALID)).nonzero().squeeze(1)
    last = torch.full((ids.shape[0],), -1, dtype=torch.long, device=events.status.device)
    last = last.scatter_reduce(0, batch.seq_idx[valid].long(), valid, "amax")
    timestamp_ns = events.timestamp_ns[last.clamp(min=0)] if len(events.status) else 0
    return torch.where(last >= 0, timestamp_ns, -1).to(ids.device)


class PromptInputsError(RuntimeError):
    """The batch holds model inputs that the default generation cannot cut to the prompts."""


def prompt_inputs(batch: Mapping, cut: torch.Tensor, image_token_id: Optional[int]) -> dict[str, torch.Tensor]:
    """The batch's model inputs besides the prompt ids, cut to the prompts ``batch["input_ids"][b, :cut[b]]`` of
    its first ``len(cut)`` rows: ``pixel_values`` with one entry per block of ``image_token_id`` tokens, in order
    over the rows (InternVL-hf, LLaVA: each image, or tile, is an equal run of image tokens), keeping the entries
    whose tokens are in a prompt; none without image tokens in the prompts. Any other input (``image_sizes``,
    ``image_grid_thw``, ...): a `PromptInputsError` naming it and pointing at ``generate_fn``."""
    extra = [k for k, v in batch.items() if k not in PROMPT_KEYS and v is not None]
    unknown = [k for k in extra if k != "pixel_values"]
    if unknown or (extra and image_token_id is None):
        raise PromptInputsError(
            f"OWAEventMetricsCallback (generation) cannot tell which part of {unknown or extra} belongs to each "
            "prompt (the default generation cuts pixel_values given one entry per image, for a model whose config "
            "names its image_token_id): pass generate_fn(input_ids, attention_mask, max_new_tokens, *, batch, cut) "
            "that builds the model's inputs for the prompts batch['input_ids'][b, :cut[b]], or leave these keys out")
    if not extra:
        return {}
    ids, pixels = batch["input_ids"], batch["pixel_values"]
    is_image = ids == image_token_id
    per_row = is_image.sum(1)
    total, in_prompt = int(per_row.sum()), (is_image[:len(cut)] & (torch.arange(ids.shape[1], device=ids.device)
                                                                   < cut[:, None])).sum(1)
    per_entry = max(total // max(len(pixels), 1), 1)  # image tokens per pixel_values entry
    if not len(pixels) or total % len(pixels) or bool((torch.cat([per_row, in_prompt]) % per_entry).any()):
        raise PromptInputsError(
            f"OWAEventMetricsCallback (generation): {total} image tokens (id {image_token_id}) in the batch do not "
            f"split into one equal run per pixel_values entry ({len(pixels)}), or a prompt cuts an image: pass "
            "generate_fn(input_ids, attention_mask, max_new_tokens, *, batch, cut) to build the prompts' inputs")
    if not bool(in_prompt.any()):
        return {}
    first = ((per_row.cumsum(0) - per_row)[:len(cut)] // per_entry).to(pixels.device)  # each row's first entry
    count = (in_prompt // per_entry).to(pixels.device)  # entries in its prompt
    shift = torch.repeat_interleave(first - (count.cumsum(0) - count), count)  # a prompt's entries: first, first + 1..
    index = torch.arange(len(shift), device=pixels.device) + shift
    return {"pixel_values": pixels.index_select(0, index)}


def _keywords(fn: Callable) -> set[str]:
    """Of ``batch`` and ``cut``, those ``fn`` accepts (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature: the 3-argument form
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"batch", "cut"}
    return {"batch", "cut"} & params.keys()


def default_generate(pl_module, tokenizer) -> Callable:
    """Greedy ``pl_module.model.generate`` (or the module's) on the prompts, with the batch's other model inputs
    cut to them (`prompt_inputs`; the image token from ``model.config.image_token_id``)."""
    model = getattr(pl_module, "model", pl_module)
    if not hasattr(model, "generate"):
        raise RuntimeError("generation mode needs pl_module.model.generate (an HF model) or generate_fn=")
    config = getattr(model, "config", None)
    image_token_id = getattr(config, "image_token_id", getattr(config, "image_token_index", None))

    def generate(input_ids, attention_mask, max_new_tokens, *, batch, cut):
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=tokenizer.pad_token_id,
                              **prompt_inputs(batch, cut, image_token_id))

    return generate
