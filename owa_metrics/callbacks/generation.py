"""Generation for the callback: cut each validation sequence into a prompt and its last events (the prompt cut
from the left, at an event, to fit the model's context), let the model continue the prompt, and return what it
generated next to the true continuation."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

import torch

from ..decode.batch import decode_batch
from ..schema import Status
from ..tokens.vocab import Role, VocabMap

GENERATE_NEEDS = ("generate_fn(input_ids, attention_mask, max_new_tokens) must return one row per prompt row "
                  "(input_ids: [batch, width], left-padded): an integer tensor [batch, any width] or a list of id "
                  "lists, each row the prompt as given followed by the new ids (HF generate's output), the row's "
                  "own prompt followed by its new ids (ragged or right-padded): "
                  "OWAEventMetricsCallback(..., generate_output='prompt_and_new'), or the new ids alone: "
                  "generate_output='new' (the default 'auto' reads either where only one reading fits); give it "
                  "keyword arguments batch=, cut= and start= (or **kwargs) to receive the validation batch and each "
                  "prompt's columns in it, batch['input_ids'][b, start[b]:cut[b]]")
GenerateOutput = Literal["auto", "prompt_and_new", "new"]
OUTPUT_FORMS = ("auto", "prompt_and_new", "new")
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "seq_length")  # a config's positions, first found
TOKENS_PER_EVENT = 80  # max_new_tokens' default per predicted event
PROMPT_KEYS = ("input_ids", "attention_mask", "labels", "tag")  # what the prompt replaces, the tag: never generate's
IMAGE_KEYS = ("pixel_values", "pixel_attention_mask", "image_grid_thw")  # the layouts `prompt_inputs` cuts


@dataclass(frozen=True)
class Budget:
    """The tokens of a generation: ``max_new`` new ones and, with a known ``context`` (read from ``source``), at
    most ``context - max_new`` for each prompt."""

    max_new: int
    context: Optional[int] = None
    source: str = ""

    @property
    def prompt(self) -> Optional[int]:
        return None if self.context is None else self.context - self.max_new


def model_context(model) -> Optional[tuple[int, str]]:
    """``(tokens, where read)``: the first of `CONTEXT_KEYS` on the model's text config (``get_text_config()``:
    the config itself for a text model, the language model's for a VLM), None without one."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in CONTEXT_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"model.config{'' if text is config else '.get_text_config()'}.{key}"
    return None


def generation_budget(pl_module, generate_fn: Optional[Callable], predict_events: int,
                      max_new_tokens: Optional[int], context_tokens: Optional[int]) -> Budget:
    """The context: ``context_tokens`` when given (at most the default generation's model's), else the model's
    (`model_context`) for the default generation, else none (a ``generate_fn``'s model is its own). ``max_new``:
    ``max_new_tokens``, else ``predict_events`` x `TOKENS_PER_EVENT`, at most half the context."""
    model = getattr(pl_module, "model", pl_module)
    own = model_context(model) if generate_fn is None and pl_module is not None else None
    if context_tokens is not None and own is not None and context_tokens > own[0]:
        raise ValueError(f"OWAEventMetricsCallback: context_tokens={context_tokens} is more than the model's "
                         f"{own[1]}={own[0]}: give at most {own[0]}, or leave context_tokens out")
    context, source = (context_tokens, "the callback's context_tokens=") if context_tokens is not None else \
        own or (None, "")
    if max_new_tokens is None:
        max_new_tokens = predict_events * TOKENS_PER_EVENT
        if context is not None:
            max_new_tokens = min(max_new_tokens, context // 2)
    return Budget(max_new_tokens, context, source)


def check_batch(batch: Any, pl_module=None, vocab: Optional[VocabMap] = None, predict_events: int = 1,
                generate_fn: Optional[Callable] = None, actions_only: bool = True,
                max_new_tokens: Optional[int] = None, context_tokens: Optional[int] = None) -> None:
    """Raise now, naming what is missing, if generation could not read this batch; with ``pl_module``, cut its
    prompts to the context (`prompt_window`) and, with no ``generate_fn``, its other model inputs to the prompts
    as the default generation will (the sanity check)."""
    if not (isinstance(batch, Mapping) and "input_ids" in batch):
        raise RuntimeError("OWAEventMetricsCallback (generation) reads the prompt from batch['input_ids'] (and "
                           "the targets from batch['labels'] when present); the batch has no 'input_ids'")
    if pl_module is not None:
        ids = batch["input_ids"]
        budget = generation_budget(pl_module, generate_fn, predict_events, max_new_tokens, context_tokens)
        *_, cut, start = split_prompt(ids, batch.get("labels", ids), vocab, predict_events, actions_only,
                                      batch.get("attention_mask"), budget)
        if generate_fn is None:
            prompt_inputs(batch, cut, model_image_token(getattr(pl_module, "model", pl_module)), start)
        else:
            _context(generate_fn, batch, cut, start)


def generate_batch(pl_module, batch: Any, batch_idx: int, tokenizer, vocab: VocabMap, generate_fn: Optional[Callable],
                   *, rows: int, predict_events: int, max_new_tokens: Optional[int], time_origin: bool,
                   actions_only: bool = True, context_tokens: Optional[int] = None,
                   generate_output: GenerateOutput = "auto"):
    """``(generated, target, origin_ns)`` for the first ``rows`` sequences of ``batch``: generated ids [B, N]
    (the prompt removed, padding as -100; ``generate_output``: how `new_ids` reads a ``generate_fn``'s rows), the
    true continuation [B, T] and, with ``time_origin``, each row's time origin (`last_event_ns`; else None).
    ``predict_events`` counts actions (``actions_only``: screens are context) or every event (`split_prompt`);
    the prompts are cut from the left to fit the context (`generation_budget`, `prompt_window`)."""
    check_batch(batch)
    ids = batch["input_ids"]
    labels = batch.get("labels", ids)
    ids, labels = ids[:rows], labels[:rows]
    attention = batch.get("attention_mask")
    budget = generation_budget(pl_module, generate_fn, predict_events, max_new_tokens, context_tokens)
    prompt, mask, target, cut, start = split_prompt(ids, labels, vocab, predict_events, actions_only,
                                                    None if attention is None else attention[:rows], budget)
    generate = generate_fn or default_generate(pl_module, tokenizer)
    context = _context(generate, batch, cut, start)
    with torch.no_grad():
        try:
            out = generate(prompt, mask, budget.max_new, **context)
        except PromptInputsError:
            raise
        except Exception as err:
            failed = f"failed at validation batch {batch_idx} ({type(err).__name__}: {err})"
            if generate_fn is None:
                context = "no context known" if budget.context is None else \
                    f"context {budget.context} tokens from {budget.source}"
                raise RuntimeError(f"OWAEventMetricsCallback: the default generation (model.generate) {failed}, "
                                   f"on prompts of up to {prompt.shape[1]} tokens with max_new_tokens="
                                   f"{budget.max_new} ({context})") from err
            raise RuntimeError(f"OWAEventMetricsCallback: generate_fn {failed}. {GENERATE_NEEDS}") from err
    try:
        generated = new_ids(as_ids(out, prompt.device), prompt, mask, budget.max_new,
                            generate_output if generate_fn else "prompt_and_new")
    except (TypeError, ValueError) as err:
        raise RuntimeError(f"OWAEventMetricsCallback cannot read what generate_fn returned at validation batch "
                           f"{batch_idx} ({type(err).__name__}: {err}). {GENERATE_NEEDS}") from err
    pad = tokenizer.pad_token_id
    if pad is not None:
        generated = torch.where(generated == pad, -100, generated)
    origin = last_event_ns(prompt, mask, vocab) if time_origin else None
    return generated, target, origin


def _context(generate: Callable, batch: Mapping, cut: torch.Tensor, start: torch.Tensor) -> dict:
    """The keywords of ``batch``, ``cut`` and ``start`` that ``generate`` takes; a function that takes ``cut`` but
    not ``start`` while a prompt was cut from the left would build other prompts than it is given: an error."""
    names = _keywords(generate)
    if "cut" in names and "start" not in names and bool(start.any()):
        raise RuntimeError("OWAEventMetricsCallback (generation): the prompts were cut from the left to fit the "
                           "context (context_tokens - max_new_tokens), so row b's prompt is batch['input_ids'][b, "
                           "start[b]:cut[b]]: give generate_fn a keyword argument start= too")
    return {name: value for name, value in (("batch", batch), ("cut", cut), ("start", start)) if name in names}


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


def new_ids(rows: torch.Tensor, prompt: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
            form: GenerateOutput = "auto") -> torch.Tensor:
    """The new ids [B, N] (-100 padded) of a generate_fn's rows [B, L] for the left-padded ``prompt`` [B, W].
    ``form="prompt_and_new"``: each row holds its prompt ids, in every row ending at one column (the prompt as
    given, HF generate's output; or any left padding) or starting at column 0 (each row's own prompt); the new ids
    follow them. ``"new"``: the rows are the new ids alone, at most ``max_new_tokens`` (longer rows hold a prompt).
    ``"auto"``: the one of the two that fits; where both do (every row begins with its prompt and none is longer
    than ``max_new_tokens``: new ids that repeat the prompt), or neither, a ValueError: never a silent cut."""
    B, W = prompt.shape
    if rows.shape[0] != B:
        raise ValueError(f"got {rows.shape[0]} rows for {B} prompt rows")
    if form not in OUTPUT_FORMS:
        raise ValueError(f"generate_output={form!r}: give one of {', '.join(map(repr, OUTPUT_FORMS))}")
    length = mask.sum(1)
    start = torch.full((B,), -1, dtype=torch.long)
    for b in range(B):  # per prompt row: the first column where its prompt ids stand
        c = int(length[b])
        if c <= rows.shape[1]:
            hits = (rows[b].unfold(0, c, 1) == prompt[b, W - c:]).all(1).nonzero()
            start[b] = int(hits[0]) if len(hits) else -1
    found, start = start >= 0, start.to(rows.device)
    given = bool(found.all()) and bool((start + length == start[0] + length[0]).all())  # the prompts as given
    own = bool(found.all()) and not bool(start.any())  # each row's own prompt, then its new ids
    short = rows.shape[1] <= max_new_tokens  # may be the new ids alone
    if form == "auto" and (given or own) and short:
        raise ValueError(f"every row begins with its prompt and none is longer than max_new_tokens={max_new_tokens} "
                         "ids: the rows read as each prompt followed by its new ids, or as new ids alone that repeat "
                         "the prompt. Say which: OWAEventMetricsCallback(..., generate_output='prompt_and_new') "
                         "(e.g. HF generate's output) or generate_output='new'")
    if form == "new" or (form == "auto" and short and not (given or own)):
        if not short:
            raise ValueError(f"rows of {rows.shape[1]} ids, more than max_new_tokens={max_new_tokens}: with "
                             "generate_output='new' each row is the new ids alone")
        begin = torch.zeros_like(length)
    elif given or own:
        begin = start + length if given else length
    elif form == "auto" and not bool(found.any()):
        raise ValueError(f"rows of {rows.shape[1]} ids (more than max_new_tokens={max_new_tokens}) hold none of the "
                         "prompts given")
    else:
        held, lacking = found.nonzero().squeeze(1).tolist(), (~found).nonzero().squeeze(1).tolist()
        how = ("no row holds its prompt" if not held else
               f"rows {held} hold their prompt (at columns {start[found].tolist()}), rows {lacking} do not" if lacking
               else f"the rows hold their prompts at columns {start.tolist()}, ending at no one column (the prompts "
                    "as given) nor starting at column 0 (their own)")
        raise ValueError(f"{how}; " + ("with generate_output='prompt_and_new' every row begins with its prompt"
                                       if form == "prompt_and_new" else "every row must begin with its prompt, or "
                                       f"be the new ids alone (at most max_new_tokens={max_new_tokens})"))
    width = max(rows.shape[1] - int(begin.min()), 0)
    pos = begin[:, None] + torch.arange(width, device=rows.device)
    return torch.where(pos < rows.shape[1], rows.gather(1, pos.clamp(max=rows.shape[1] - 1)), -100)


def prompt_part(values: torch.Tensor, cut: torch.Tensor, start: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``values[b, start[b]:cut[b]]`` (``start`` 0 when None) of the first ``len(cut)`` rows, left-padded with 0 to
    the longest (at least 1): the prompts' layout."""
    start = torch.zeros_like(cut) if start is None else start
    width = max(int((cut - start).max()), 1)
    pos = torch.arange(width, device=values.device) - (width - cut)[:, None]
    return torch.where(pos >= start[:, None], values[:len(cut)].gather(1, pos.clamp(min=0)), 0)


def prompt_window(ids: torch.Tensor, cut: torch.Tensor, vocab, budget: Budget) -> torch.Tensor:
    """[B]: the first column of each row's prompt ``ids[b, start[b]:cut[b]]``: 0 when the prompt ``ids[b, :cut[b]]``
    has at most ``budget.prompt`` tokens (or no context is known), else the first ``<EVENT_START>`` at or after
    ``cut[b] - budget.prompt`` (the prompt cut from the left, whole events kept). Where even the prompt's last event
    does not fit: a RuntimeError naming the numbers and the settings to change."""
    start = torch.zeros_like(cut)
    if budget.prompt is None:
        return start
    pos = torch.arange(ids.shape[1], device=ids.device)
    starts = ((vocab.codes(ids[:len(cut)]) & 0xF) == int(Role.START)) & (pos < cut[:, None])
    later = starts & (pos >= (cut - budget.prompt)[:, None])
    start = torch.where(cut <= budget.prompt, start, torch.where(later.any(1), later.long().argmax(1), cut))
    empty = (start >= cut) & (cut > 0)
    if bool(empty.any()):
        b = int(empty.nonzero()[0])
        last = int(torch.where(starts[b], pos, 0).max())
        raise RuntimeError(
            f"OWAEventMetricsCallback (generation): the prompts get context_tokens - max_new_tokens = "
            f"{budget.context} - {budget.max_new} = {budget.prompt} tokens (context_tokens from {budget.source}), "
            f"and the last event of row {b}'s prompt alone is {int(cut[b]) - last} tokens: give a smaller "
            "max_new_tokens= (or predict_events=, for its default), or a larger context_tokens= (at most the "
            "model's positions)")
    return start


def split_prompt(ids: torch.Tensor, labels: torch.Tensor, vocab, predict_events: int, actions_only: bool = True,
                 attention_mask: Optional[torch.Tensor] = None, budget: Optional[Budget] = None):
    """``(prompt, mask, target, cut, start)``: each row is cut at ``cut[b]``, the start of its last
    ``predict_events`` events (with ``actions_only``, its last ``predict_events`` actions: screens are context, not
    predicted), keeping at least its first one; a row with nothing to predict is its prompt whole, up to its last
    attended token (``attention_mask``; else the row's width). prompt = ``ids[b, start[b]:cut[b]]``, left-padded,
    with a mask: ``start`` 0, or with a ``budget`` the prompt cut from the left to fit it (`prompt_window`);
    target = the rest of the row's labels (left-aligned, -100 padded)."""
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
    start = torch.zeros_like(cut) if budget is None else prompt_window(ids, cut, vocab, budget)
    prompt = prompt_part(ids, cut, start)
    mask = torch.arange(prompt.shape[1], device=ids.device) >= (prompt.shape[1] - (cut - start))[:, None]
    tail = pos + cut[:, None]
    target = torch.where(tail < T, labels.gather(1, tail.clamp(max=T - 1)), -100)
    return prompt, mask.long(), target, cut, start


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


def prompt_inputs(batch: Mapping, cut: torch.Tensor, image_token_id: Optional[int],
                  start: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """The batch's model inputs besides the prompt ids, cut to the prompts ``batch["input_ids"][b, start[b]:cut[b]]``
    (``start`` 0 when None) of its first ``len(cut)`` rows: a key shaped like ``input_ids`` (``mm_token_type_ids``)
    as the ids are; the images whose ``image_token_id`` tokens are in a prompt, in the batch's layout
    (`_prompt_images`: one entry per image, [B, images, ...] with ``pixel_attention_mask``, or patches with ``image_grid_thw``), none without image tokens
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
            "batch, cut, start) that builds the model's inputs for the prompts batch['input_ids'][b, start[b]:cut[b]], "
            "or leave these keys out")
    start = torch.zeros_like(cut) if start is None else start
    out = {k: prompt_part(extra[k], cut, start) for k in per_token}
    return {**out, **_prompt_images(extra, ids, cut, start, image_token_id)} if images else out


def _prompt_images(inputs: Mapping, ids: torch.Tensor, cut: torch.Tensor, start: torch.Tensor,
                   image_token_id: int) -> dict:
    """The prompts' images. The batch's images, in order over its rows, each own a run of its image tokens:
    ``pixel_values`` [images, ...] (InternVL-hf, LLaVA: an equal run each); [B, max images, ...] zero-padded,
    row b's images first, with ``pixel_attention_mask`` [B, max images, H, W] (Idefics3 / SmolVLM: an equal run
    each); or patches [sum of patches, dim] with ``image_grid_thw`` [images, 3] (Qwen2-VL / Qwen2.5-VL: image i's
    prod(grid[i]) patches, merged into prod(grid[i]) / merge tokens). An image is a prompt's when its whole run is
    in it (columns ``start[b]`` to ``cut[b]``); runs that do not fit the rows, or a prompt that cuts one, are a
    `PromptInputsError`."""
    pixels, grid, pixel_mask = inputs["pixel_values"], inputs.get("image_grid_thw"), inputs.get("pixel_attention_mask")
    is_image = ids == image_token_id
    per_row = is_image.sum(1)
    pos = torch.arange(ids.shape[1], device=ids.device)
    before = (is_image[:len(cut)] & (pos < start[:, None])).sum(1)  # the row's image tokens left of its prompt
    in_prompt = (is_image[:len(cut)] & (pos >= start[:, None]) & (pos < cut[:, None])).sum(1)
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
    lo = row_start[:len(cut)] + before
    hi = lo + in_prompt
    bounds = torch.cat([ends.new_zeros(1), ends])
    first = is_image & ~torch.nn.functional.pad(is_image[:, :-1], (1, 0))
    run = first.flatten().cumsum(0)[is_image.flatten()]  # each image token's run of adjacent image tokens
    fits = fits and int(tokens.sum()) == total and bool((run[(ends - tokens)[tokens > 0]] == run[
        ends[tokens > 0] - 1]).all())  # an image's tokens are one run, or part of one (InternVL's tiles)
    if not fits or not bool(torch.isin(torch.cat([row_start, lo, hi]), bounds).all()):
        raise PromptInputsError(
            f"OWAEventMetricsCallback (generation): the batch's {total} image tokens (id {image_token_id}) do not "
            f"split into one run per image of pixel_values {tuple(pixels.shape)}"
            f"{'' if grid is None else ' with image_grid_thw'}, row by row, or a prompt cuts an image: pass "
            "generate_fn(input_ids, attention_mask, max_new_tokens, *, batch, cut, start) to build the prompts' "
            "inputs")
    if not bool(in_prompt.any()):
        return {}
    chosen = ((lo[:, None] <= ends - tokens) & (ends <= hi[:, None])).any(0)  # [images]: in a prompt
    if grid is not None:
        return {"pixel_values": pixels[chosen.repeat_interleave(patches).to(pixels.device)],
                "image_grid_thw": grid[chosen.to(grid.device)]}
    if pixels.dim() == 5:  # row b's images skip[b] to skip[b] + count[b], moved to the front
        count, skip = in_prompt // tokens[0], before // tokens[0]
        k = torch.arange(int(count.max()), device=ids.device)
        keep = (k < count[:, None]).to(pixels.device)
        row = torch.arange(len(cut), device=pixels.device)[:, None]
        image = (skip[:, None] + k).clamp(max=pixels.shape[1] - 1).to(pixels.device)
        out = {"pixel_values": pixels[row, image] * keep[:, :, None, None, None]}
        if pixel_mask is not None:
            out["pixel_attention_mask"] = pixel_mask[row, image] * keep[:, :, None, None]
        return out
    return {"pixel_values": pixels[chosen.to(pixels.device)]}


def model_image_token(model) -> Optional[int]:
    """The image token of an HF VLM (``config.image_token_id``, or LLaVA's older ``image_token_index``)."""
    config = getattr(model, "config", None)
    return getattr(config, "image_token_id", getattr(config, "image_token_index", None))


def _keywords(fn: Callable) -> set[str]:
    """Of ``batch``, ``cut`` and ``start``, those ``fn`` accepts (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature: the 3-argument form
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"batch", "cut", "start"}
    return {"batch", "cut", "start"} & params.keys()


def default_generate(pl_module, tokenizer) -> Callable:
    """Greedy ``pl_module.model.generate`` (or the module's) on the prompts, with the batch's other model inputs
    cut to them (`prompt_inputs`; the image token from the model's config: `model_image_token`); its rows are HF
    generate's, the prompts as given followed by the new ids."""
    model = getattr(pl_module, "model", pl_module)
    if not hasattr(model, "generate"):
        raise RuntimeError("generation mode needs pl_module.model.generate (an HF model) or generate_fn=")
    image_token = model_image_token(model)

    def generate(input_ids, attention_mask, max_new_tokens, *, batch, cut, start):
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=tokenizer.pad_token_id,
                              **prompt_inputs(batch, cut, image_token, start))

    return generate
