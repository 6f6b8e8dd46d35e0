"""Tokenizers for the event format: an offline one to build, and the id -> role map for any HF tokenizer."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

import torch

from ..schema import IMAGE_BIT, ROLE_MASK, SKIP_BIT, STRUCT_BIT, VALUE_SHIFT, Role
from .codec import FORMATS, CodecConfig
from .format import VALUED

# Image-token conventions of VLMs, recognised in a vocabulary: (prefix, image token, count, suffix). The count is
# what encoding a screen writes (a Qwen2-VL image has as many tokens as its patches; 256 for 448 x 448 pixels);
# decoding reads a run of any length.
IMAGE_CONVENTIONS = {
    "InternVL": (("<img>",), "<IMG_CONTEXT>", 256, ("</img>",)),
    "SmolVLM": (("<fake_token_around_image>", "<global-img>"), "<image>", 64, ("<fake_token_around_image>",)),
    "Qwen2-VL": (("<|vision_start|>",), "<|image_pad|>", 256, ("<|vision_end|>",)),  # Qwen2.5-VL's too
}


def image_tokens(spec: str) -> tuple[tuple[str, ...], str, int, tuple[str, ...]]:
    """``(prefix, image token, count, suffix)`` of a known VLM's name (`IMAGE_CONVENTIONS`, any case; Qwen2.5-VL
    reads as Qwen2-VL) or of a screen's image written as `VocabMap.describe` says it, ``"<img> <IMG_CONTEXT> x 256
    </img>"`` (the image token, ``x``, its count; the tokens before and after it are the prefix and suffix)."""
    names = {name.lower(): name for name in IMAGE_CONVENTIONS}
    name = names.get(spec.strip().lower().replace("qwen2.5-vl", "qwen2-vl"))
    if name:
        return IMAGE_CONVENTIONS[name]
    words = spec.split()
    at = [i for i in range(1, len(words) - 1) if words[i] == "x" and words[i + 1].isdigit()]
    if len(at) != 1 or int(words[at[0] + 1]) < 1:
        raise ValueError(f"image tokens {spec!r}: give a VLM's name ({', '.join(IMAGE_CONVENTIONS)}) or a screen's "
                         "image tokens as 'PREFIX... IMAGE x COUNT SUFFIX...', e.g. '<img> <IMG_CONTEXT> x 256 </img>'")
    i = at[0]
    return tuple(words[:i - 1]), words[i - 1], int(words[i + 1]), tuple(words[i + 2:])


def _pack(roles: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """STRUCT: start / end; SKIP: ignored or episode (never opens a cut-off span); IMAGE: image or ignored."""
    def any_of(*rs):
        return sum((roles == int(r)).long() for r in rs)

    return (roles | any_of(Role.START, Role.END) * STRUCT_BIT | any_of(Role.IGNORED, Role.EPISODE) * SKIP_BIT
            | any_of(Role.IMAGE, Role.IGNORED) * IMAGE_BIT | (values + 1) << VALUE_SHIFT)


SPECIAL_TOKENS = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "<eos>"}


def resolve_config(config: Optional[CodecConfig] = None, format: Optional[str] = None) -> CodecConfig:
    """``config`` as given, else the preset named ``format`` (hierarchical when neither is given)."""
    if config is not None and format is not None and config.format != format:
        raise ValueError(f"format={format!r} contradicts config.format={config.format!r}: pass one of them")
    return config or CodecConfig.preset(format or "hierarchical")


def build_tokenizer(config: CodecConfig | None = None, extra_tokens: Sequence[str] = (), format: Optional[str] = None):
    """An offline ``PreTrainedTokenizerFast`` (WordLevel) whose vocabulary is exactly the event format.

    Ids: ``<pad>`` 0, ``<unk>`` 1, ``<eos>`` 2, then the event tokens, image / episode tokens, ``extra_tokens``.
    Text splits at every ``<...>``; ``decode`` joins tokens without spaces, so ``decode(encode(s)) == s``.
    ``format="factorized"`` (or a ``config``) picks the format; hierarchical by default.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    c = resolve_config(config, format)
    words = dict.fromkeys([*SPECIAL_TOKENS.values(), *c.event_tokens, *c.extra_tokens, *extra_tokens])
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[^<>]*>"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIAL_TOKENS)


def detect_format(vocab: dict[str, int]) -> str:
    """The registered format whose event tokens (its preset's) the vocabulary holds: ``<VK_0>``, ``<MB_0>``,
    ``<SIGN_PLUS>`` ... -> factorized; ``<0>``..``<255>`` -> hierarchical. Several or none: a ValueError saying what
    to do."""
    found = [name for name, spec in FORMATS.items() if all(t in vocab for t in spec.preset.event_tokens)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(f"the tokenizer holds the tokens of several formats ({', '.join(found)}): pass "
                         f"{' or '.join(f'format={name!r}' for name in found)} (or config=CodecConfig.preset(...))")
    needs = "; ".join(f"{name} misses {_missing_text(spec.preset, vocab)}" for name, spec in FORMATS.items())
    raise ValueError(
        f"the tokenizer lacks OWA event tokens ({needs}). Add a format's tokens with "
        "tokenizer.add_tokens(sorted(owa_metrics.CodecConfig.preset(NAME).event_tokens)) and resize the model's "
        "embeddings, or build one with owa_metrics.build_tokenizer(format=NAME); if your tokens are named "
        "differently, pass a matching CodecConfig.")


def detect_images(vocab: dict[str, int], config: CodecConfig) -> CodecConfig:
    """``config`` with the image tokens of the first known VLM convention the vocabulary holds (`IMAGE_CONVENTIONS`);
    unchanged when it holds none (screens then decode from the placeholder or ignored labels)."""
    for prefix, token, count, suffix in IMAGE_CONVENTIONS.values():
        if all(t in vocab for t in (*prefix, token, *suffix)):
            return replace(config, image_prefix=prefix, image_token=token, image_token_count=count, image_suffix=suffix)
    return config


def _missing_text(config: CodecConfig, vocab) -> str:
    missing = [t for t in config.event_tokens if t not in vocab]
    return ", ".join(missing[:6]) + (f", ... ({len(missing)} in all)" if len(missing) > 6 else "")


class VocabMap:
    """Token id -> (`Role`, token value) lookup tables for a tokenizer that has the event tokens.

    Works with any HF tokenizer whose vocabulary holds the format's tokens (as OWA training adds them with
    ``tokenizer.add_tokens``). Negative ids (-100) map to ``Role.IGNORED``, ids past the vocabulary to OTHER.
    """

    def __init__(self, vocab: dict[str, int], config: CodecConfig | None = None, size: Optional[int] = None):
        self.config = c = config or CodecConfig()
        missing = [t for t in c.event_tokens if t not in vocab]
        if missing:
            raise ValueError(
                f"the tokenizer lacks the {c.format} format's OWA event tokens: {_missing_text(c, vocab)}. Add them "
                f"with tokenizer.add_tokens(sorted(owa_metrics.CodecConfig.preset({c.format!r}).event_tokens)) and "
                "resize the model's embeddings, or build one with owa_metrics.build_tokenizer(); if your tokens are "
                "named differently, pass a matching CodecConfig.")
        self.size = max(size or 0, max(vocab.values()) + 1)
        named = dict(c.token_format.tokens)
        named.update({t: (Role.EPISODE, 0) for t in (c.episode_start, c.episode_end)})
        named.update({t: (Role.IMAGE, 0) for t in c.image_role_tokens})
        self.ids = {token: vocab[token] for token in named if token in vocab}
        # codes[id + 1]: index 0 is an ignored label (any negative id), the last index any id past the vocabulary
        roles = torch.full((self.size + 2,), int(Role.OTHER), dtype=torch.int64)
        values = torch.full((self.size + 2,), -1, dtype=torch.int64)
        for token, token_id in self.ids.items():
            role, value = named[token]
            roles[token_id + 1] = int(role)
            if role in VALUED:
                values[token_id + 1] = value
        roles[0] = int(Role.IGNORED)
        self.codes_table = _pack(roles, values).to(torch.int32)
        self._id_to_token = {i: t for t, i in vocab.items()}
        self._tables: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer, config: CodecConfig | None = None, format: Optional[str] = None) -> "VocabMap":
        """From any HF tokenizer (``get_vocab()`` includes added tokens).

        With neither ``config`` nor ``format`` the format is detected from the vocabulary (`detect_format`);
        without ``config`` the image tokens are too (`IMAGE_CONVENTIONS`). A ``config`` is used as given.
        """
        if not hasattr(tokenizer, "get_vocab"):
            raise TypeError(f"expected a Hugging Face tokenizer (with get_vocab()), got {type(tokenizer).__name__}; "
                            "load it first, e.g. AutoTokenizer.from_pretrained(...), with the event tokens added")
        vocab = tokenizer.get_vocab()
        if config is None:
            config = detect_images(vocab, CodecConfig.preset(format or detect_format(vocab)))
        return cls(vocab, resolve_config(config, format), size=len(tokenizer))

    def describe(self) -> str:
        """``factorized format, screens as <img> <IMG_CONTEXT> x 256 </img>``: what this map decodes, naming only
        image tokens the vocabulary holds."""
        c = self.config
        images = (*c.image_prefix, c.image_token, *c.image_suffix)
        if all(t in self.ids for t in images):
            return f"{c.format} format, screens as {c.image_description}"
        held = [t for t in (c.screen_placeholder, *images) if t in self.ids]
        return (f"{c.format} format, no image tokens of a known VLM in the vocabulary: a screen event's image is "
                + (f"{' or '.join(held)}, or " if held else "") + "ignored labels (-100) between its "
                "timestamp and <EVENT_END>; pass a CodecConfig naming your model's image tokens if it has some")

    def codes(self, ids: torch.Tensor) -> torch.Tensor:
        """Packed per-token codes shaped like ``ids``, on its device: role, flag bits and token value (see `_pack`)."""
        table = self._tables.get(ids.device)
        if table is None:
            table = self._tables[ids.device] = self.codes_table.to(ids.device)
        index = ids.reshape(-1).long().clamp(-1, self.size) + 1
        return table.index_select(0, index).view(ids.shape)

    def lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(role, value)`` tensors shaped like ``ids``, on its device (value -1 for tokens without one)."""
        codes = self.codes(ids)
        return codes & ROLE_MASK, (codes >> VALUE_SHIFT) - 1

    def token(self, token_id: int) -> Optional[str]:
        """The token string of an id (None for a negative id: an ignored label); the reference path uses it."""
        if token_id < 0:
            return None
        return self._id_to_token.get(token_id, f"<id {token_id}>")

    def encode_sequences(self, events, max_tokens: int, ignore_images: bool = False) -> list[list[int]]:
        """``events`` packed whole into sequences of at most ``max_tokens`` ids (an event never splits)."""
        sequences: list[list[int]] = [[]]
        for event in events:
            ids = self.encode([event], ignore_images)
            if len(ids) > max_tokens:
                raise ValueError(f"a {event.kind} event takes {len(ids)} tokens, more than max_tokens={max_tokens}")
            if len(sequences[-1]) + len(ids) > max_tokens:
                sequences.append([])
            sequences[-1].extend(ids)
        return [s for s in sequences if s]

    def encode(self, events, ignore_images: bool = False) -> list[int]:
        """Token ids of ``events`` (screens with their image tokens); ``ignore_images`` writes them as -100."""
        from .codec import EventCodec

        codec, image = EventCodec(self.config), self.config.image_role_tokens
        out = []
        for event in events:
            for token in codec.tokens(event, expand_images=True):
                if ignore_images and token in image:
                    out.append(-100)
                elif token in self.ids:
                    out.append(self.ids[token])
                else:
                    raise ValueError(f"the tokenizer has no {token!r}: screen events need the image tokens of "
                                     "the CodecConfig (image_prefix, image_token, image_suffix). Add them with "
                                     "tokenizer.add_tokens(list(config.extra_tokens)) and resize the model's "
                                     "embeddings, or pass the config of your VLM's image tokens (docs/VLM.md)")
        return out
