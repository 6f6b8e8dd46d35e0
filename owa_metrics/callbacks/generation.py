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

GENERATE_NEEDS = ("generate_fn(input_ids, attention_mask, max_new_tokens) must return one row per prompt row "
                  "(input_ids: [batch, width], left-padded): an integer tensor [batch, any width] or a list of id "
                  "lists, each row the prompt as given followed by the new ids (HF generate's output), the row's "
                  "own prompt followed by its new ids (ragged or right-padded), or the new ids alone; give it "
                  "keyword arguments batch= and cut= (or **kwargs) to receive the validation batch and each "
                  "prompt's length in it")
PROMPT_KEYS = ("input_ids", "attention_mask", "labels", "tag")  # what the prompt replaces, the tag: never generate's
IMAGE_KEYS = ("pixel_values", "pixel_attention_mask", "image_grid_thw")  # the layouts `prompt_inputs` cuts


def check_batch(batch: Any, pl_module=None, vocab: Optional[VocabMap] = None, predict_events: int = 1,
                generate_fn: Optional[Callable] = None, actions_only: bool = True) -> None:
    """Raise now, naming what is missing, if generation could not read this batch; with ``pl_module`` and no
    ``generate_fn``, cut its other model inputs to the prompts as the default generation will (the sanity check)."""
    if not (isinstance(batch, Mapping) and "input_ids" in batch):
        raise RuntimeError("OWAEventMetricsCallback (generation) reads the prompt from batch['input_ids'] (and "
                           "the targets from batch['labels'] when present); the batch has no 'input_ids'")
    if pl_module is not None and generate_fn is None:
        ids = batch["input_ids"]
        cut = split_prompt(ids, batch.get("labels", ids), vocab, predict_events, actions_only,
                           batch.get("attention_mask"))[3]
        prompt_inputs(batch, cut, model_image_token(getattr(pl_module, "model", pl_module)))


def generate_batch(pl_module, batch: Any, batch_idx: int, tokenizer, vocab: VocabMap, generate_fn: Optional[Callable],
                   *, rows: int, predict_events: int, max_new_tokens: Optional[int], time_origin: bool,
                   actions_only: bool = True):
    """``(generated, target, origin_ns)`` for the first ``rows`` sequences of ``batch``: generated ids [B, N]
    (the prompt removed, padding as -100), the true continuation [B, T] and, with ``time_origin``, each row's
    time origin (`last_event_ns`; else None). ``predict_events`` counts actions (``actions_only``: screens are
    context) or every event (`split_prompt`)."""
    check_batch(batch)
    ids = batch["input_ids"]
    labels = batch.get("labels", ids)
    ids, labels = ids[:rows], labels[:rows]
    attention = batch.get("attention_mask")
    prompt, mask, target, cut = split_prompt(ids, labels, vocab, predict_events, actions_only,
                                             None if attention is None else attention[:rows])
    generate = generate_fn or default_generate(pl_module, tokenizer)
    max_new = max_new_tokens or predict_events * 80
    context = {name: value for name, value in (("batch", batch), ("cut", cut)) if name in _keywords(generate)}
    with torch.no_grad():
        try:
            out = generate(prompt, mask, max_new, **context)
        except PromptInputsError:
            raise
        except Exception as err:
            raise RuntimeError(f"OWAEventMetricsCallback: generate_fn failed at validation batch {batch_idx} "
                               f"({type(err).__name__}: {err}). {GENERATE_NEEDS}") from err
    try:
        generated = new_ids(as_ids(out, prompt.device), prompt, mask, max_new)
    except (TypeError, ValueError) as err:
        raise RuntimeError(f"OWAEventMetricsCallback cannot read what generate_fn returned at validation batch "
                           f"{batch_idx} ({type(err).__name__}: {err}). {GENERATE_NEEDS}") from err
    pad = tokenizer.pad_token_id
    if pad is not None:
        generated = torch.where(generated == pad, -100, generated)
    origin = last_event_ns(prompt, mask, vocab) if time_origin else None
    return generated, target, origin


def as_ids(out: Any, device) -> torch.Tensor:
    """A generate_fn's output as ids [B, T]: a tensor, a list of id lists (ragged rows padded with -100), or HF
    generate's dict output (its ``sequences``)."""
    if not isinstance(out, (torch.Tensor, list, tuple)) and isinstance(getattr(out, "sequences", None), torch.Tensor):
        out = out.sequences
    if isinstance(out, torch.Tensor) and out.dim() == 2 and not out.is_floating_point():
        return out.to(device)
    if isinstance(out, (list, tuple)) and all(isinstance(row, (list, tuple, torch.Tensor)) for row in out):
        rows = [torch.as_tensor(row, dtype=torch.long).reshape(-1) for row in out]
        width = max((r.numel() for r in rows), default=0)
        return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel()), value=-100) for r in rows]).to(device)
    raise TypeError(f"got {type(out).__name__}" + (f" of shape {tuple(out.shape)} / {out.dtype}"
                                                   if isinstance(out, torch.Tensor) else ""))


def new_ids(rows: torch.Tensor, prompt: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """The new ids [B, N] (-100 padded) of a generate_fn's rows [B, L] for the left-padded ``prompt`` [B, W]: each
    row's prompt ids are looked for in it; found in every row, ending at one column (the prompt as given, HF
    generate's output; or any left padding) or starting at column 0 (each row's own prompt), the new ids follow
    them; found in none, the rows are the new ids alone (at most ``max_new_tokens``: longer rows hold a prompt the
    callback did not give, e.g. re-tokenized). Anything else is a ValueError: never a silent cut."""
    B, W = prompt.shape
    if rows.shape[0] != B:
        raise ValueError(f"got {rows.shape[0]} rows for {B} prompt rows")
    length = mask.sum(1)
    start = torch.full((B,), -1, dtype=torch.long)
    for b in range(B):  # per prompt row: the first column where its prompt ids stand
        c = int(length[b])
        if c <= rows.shape[1]:
            hits = (rows[b].unfold(0, c, 1) == prompt[b, W - c:]).all(1).nonzero()
            start[b] = int(hits[0]) if len(hits) else -1
    found, start = start >= 0, start.to(rows.device)
    if bool(found.all()) and bool((start + length == start[0] + length[0]).all()):
        begin = start + length  # the prompts as given (left-padded)
    elif bool(found.all()) and not bool(start.any()):
        begin = length  # each row's own prompt, then its new ids
    elif not bool(found.any()) and rows.shape[1] <= max_new_tokens:
        begin = torch.zeros_like(length)  # the new ids alone
    elif not bool(found.any()):
        raise ValueError(f"rows of {rows.shape[1]} ids (more than max_new_tokens={max_new_tokens}) hold none of the "
                         "prompts given")
    else:
        raise ValueError(f"rows {found.nonzero().squeeze(1).tolist()} hold their prompt (at columns "
                         f"{start[found].tolist()}), rows {(~found).nonzero().squeeze(1).tolist()} do not; every "
                         "row must be read the same way")
    width = max(rows.shape[1] - int(begin.min()), 0)
    pos = begin[:, None] + torch.arange(width, device=rows.device)
    return torch.where(pos < rows.shape[1], rows.gather(1, pos.clamp(max=rows.shape[1] - 1)), -100)


def prompt_part(values: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """``values[b, :cut[b]]`` of the first ``len(cut)`` rows, left-padded with 0 to the longest (at least 1): the
    prompts' layout."""
    width = max(int(cut.max()), 1)
    pos = torch.arange(width, device=values.device) - (width - cut)[:, None]
    return torch.where(pos >= 0, values[:len(cut)].gather(1, pos.clamp(min=0)), 0)


def split_prompt(ids: torch.Tensor, labels: torch.Tensor, vocab, predict_events: int, actions_only: bool = True,
                 attention_mask: Optional[torch.Tensor] = None):
    """``(prompt, mask, target, cut)``: prompt = each row up to the start of its last ``predict_events`` events
    (with ``actions_only``, its last ``predict_events`` actions: screens are context, not predicted), keeping at
    least its first one (left-padded, with a mask), ``ids[b, :cut[b]]``; a row with nothing to predict is its
    prompt whole, up to its last attended token (``attention_mask``; else the row's width); target = the rest of
    the row's labels (left-aligned, -100 padded)."""
    B, T = ids.shape
    roles = vocab.codes(ids) & 0xF
    starts = roles == int(Role.START)
    if actions_only:  # an event whose type token is <SCREEN> is no action
        starts &= torch.nn.functional.pad(roles[:, 1:] != int(Role.SCREEN), (0, 1), value=True)
    count = starts.sum(1)
    keep_events = torch.maximum(count - predict_events, count.clamp(max=1))  # keep one event as context
    rank = starts.long().cumsum(1)
    is_cut = starts & (rank == (keep_events + 1)[:, None])
    pos = torch.arange(T, device=ids.device)
    whole = torch.full_like(count, T) if attention_mask is None else \
        torch.where(attention_mask.bool(), pos + 1, 0).amax(1)  # the row's end (right padding cut off)
    cut = torch.where(is_cut.any(1), is_cut.long().argmax(1), whole)
    prompt = prompt_part(ids, cut)
    mask = torch.arange(prompt.shape[1], device=ids.device) >= (prompt.shape[1] - cut)[:, None]
    tail = pos + cut[:, None]
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
    its first ``len(cut)`` rows: a key shaped like ``input_ids`` (``mm_token_type_ids``) as the ids are; the images
    whose ``image_token_id`` tokens are in a prompt, in the batch's layout (`_prompt_images`: one entry per image,
    [B, images, ...] with ``pixel_attention_mask``, or patches with ``image_grid_thw``), none without image tokens
    in the prompts. Any other input (``image_sizes``, ...): a `PromptInputsError` naming it and pointing at
    ``generate_fn``."""
    ids = batch["input_ids"]
    extra = {k: v for k, v in batch.items() if k not in PROMPT_KEYS and v is not None}
    per_token = [k for k, v in extra.items()
                 if k not in IMAGE_KEYS and isinstance(v, torch.Tensor) and v.shape == ids.shape]
    unknown = [k for k in extra if k not in IMAGE_KEYS and k not in per_token]
    images = [k for k in extra if k in IMAGE_KEYS]
    if unknown or (images and (image_token_id is None or "pixel_values" not in images)):
        raise PromptInputsError(
            f"OWAEventMetricsCallback (generation) cannot tell which part of {unknown or images} belongs to each "
            "prompt (the default generation cuts keys shaped like input_ids, and pixel_values with one entry per "
            "image, [batch, images, ...] with pixel_attention_mask, or patches with image_grid_thw, for a model "
            "whose config names its image_token_id): pass generate_fn(input_ids, attention_mask, max_new_tokens, *, "
            "batch, cut) that builds the model's inputs for the prompts batch['input_ids'][b, :cut[b]], or leave "
            "these keys out")
    out = {k: prompt_part(extra[k], cut) for k in per_token}
    return {**out, **_prompt_images(extra, ids, cut, image_token_id)} if images else out


def _prompt_images(inputs: Mapping, ids: torch.Tensor, cut: torch.Tensor, image_token_id: int) -> dict:
    """The prompts' images. The batch's images, in order over its rows, each own a run of its image tokens:
    ``pixel_values`` [images, ...] (InternVL-hf, LLaVA: an equal run each); [B, max images, ...] zero-padded,
    row b's images first, with ``pixel_attention_mask`` [B, max images, H, W] (Idefics3 / SmolVLM: an equal run
    each); or patches [sum of patches, dim] with ``image_grid_thw`` [images, 3] (Qwen2-VL / Qwen2.5-VL: image i's
    prod(grid[i]) patches, merged into prod(grid[i]) / merge tokens). An image is a prompt's when its whole run is
    in it; runs that do not fit the rows, or a prompt that cuts one, are a `PromptInputsError`."""
    pixels, grid, pixel_mask = inputs["pixel_values"], inputs.get("image_grid_thw"), inputs.get("pixel_attention_mask")
    is_image = ids == image_token_id
    per_row = is_image.sum(1)
    in_prompt = (is_image[:len(cut)] & (torch.arange(ids.shape[1], device=ids.device) < cut[:, None])).sum(1)
    total, fits = int(per_row.sum()), True
    if grid is not None:  # patches: image i has prod(grid[i]), merged into tokens
        patches = grid.prod(1).to(ids.device)
        merge = max(int(patches.sum()) // max(total, 1), 1)
        tokens = patches // merge
        fits = pixels.dim() == 2 and len(pixels) == int(patches.sum()) and bool((tokens * merge == patches).all())
    elif pixels.dim() == 5:  # per row, zero-padded after each row's images
        real = (pixel_mask if pixel_mask is not None else pixels != 0).flatten(2).any(2).to(ids.device)
        count = real.sum(1)
        per = total // max(int(count.sum()), 1)
        tokens = torch.full((int(count.sum()),), per, device=ids.device)
        fits = bool((real == (torch.arange(real.shape[1], device=ids.device) < count[:, None])).all()) and bool(
            (per_row == count * per).all())
    else:  # one entry per image
        tokens = torch.full((len(pixels),), total // max(len(pixels), 1), device=ids.device)
    ends = tokens.cumsum(0)  # each image's tokens end there among the batch's image tokens in order
    row_start = per_row.cumsum(0) - per_row
    lo, hi = row_start[:len(cut)], row_start[:len(cut)] + in_prompt
    bounds = torch.cat([ends.new_zeros(1), ends])
    first = is_image & ~torch.nn.functional.pad(is_image[:, :-1], (1, 0))
    run = first.flatten().cumsum(0)[is_image.flatten()]  # each image token's run of adjacent image tokens
    fits = fits and int(tokens.sum()) == total and bool((run[(ends - tokens)[tokens > 0]] == run[
        ends[tokens > 0] - 1]).all())  # an image's tokens are one run, or part of one (InternVL's tiles)
    if not fits or not bool(torch.isin(torch.cat([row_start, hi]), bounds).all()):
        raise PromptInputsError(
            f"OWAEventMetricsCallback (generation): the batch's {total} image tokens (id {image_token_id}) do not "
            f"split into one run per image of pixel_values {tuple(pixels.shape)}"
            f"{'' if grid is None else ' with image_grid_thw'}, row by row, or a prompt cuts an image: pass "
            "generate_fn(input_ids, attention_mask, max_new_tokens, *, batch, cut) to build the prompts' inputs")
    if not bool(in_prompt.any()):
        return {}
    chosen = ((lo[:, None] <= ends - tokens) & (ends <= hi[:, None])).any(0)  # [images]: in a prompt
    if grid is not None:
        return {"pixel_values": pixels[chosen.repeat_interleave(patches).to(pixels.device)],
                "image_grid_thw": grid[chosen.to(grid.device)]}
    if pixels.dim() == 5:
        count = in_prompt // tokens[0]
        keep = (torch.arange(int(count.max()), device=ids.device) < count[:, None]).to(pixels.device)
        out = {"pixel_values": pixels[:len(cut), :keep.shape[1]] * keep[:, :, None, None, None]}
        if pixel_mask is not None:
            out["pixel_attention_mask"] = pixel_mask[:len(cut), :keep.shape[1]] * keep[:, :, None, None]
        return out
    return {"pixel_values": pixels[chosen.to(pixels.device)]}


def model_image_token(model) -> Optional[int]:
    """The image token of an HF VLM (``config.image_token_id``, or LLaVA's older ``image_token_index``)."""
    config = getattr(model, "config", None)
    return getattr(config, "image_token_id", getattr(config, "image_token_index", None))


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
    cut to them (`prompt_inputs`; the image token from the model's config: `model_image_token`)."""
    model = getattr(pl_module, "model", pl_module)
    if not hasattr(model, "generate"):
        raise RuntimeError("generation mode needs pl_module.model.generate (an HF model) or generate_fn=")
    image_token = model_image_token(model)

    def generate(input_ids, attention_mask, max_new_tokens, *, batch, cut):
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=tokenizer.pad_token_id,
                              **prompt_inputs(batch, cut, image_token))

    return generate
