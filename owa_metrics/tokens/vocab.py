"""Tokenizers for the event format: an offline one to build, and the id -> role map for any HF tokenizer."""

from __future__ import annotations

from enum import IntEnum
from typing import Optional, Sequence

import torch

from .codec import CodecConfig


class Role(IntEnum):
    """What a token id means to the decoder."""

    OTHER = 0
    START = 1
    END = 2
    KEYBOARD = 3
    MOUSE = 4
    SCREEN = 5
    PRESS = 6
    RELEASE = 7
    DIGIT = 8
    IMAGE = 9  # screen placeholder, image prefix / image / suffix tokens
    EPISODE = 10  # <EPISODE_START> / <EPISODE_END>
    IGNORED = 11  # a negative id (-100 labels)


# A token's packed code: role in bits 0-3, flag bits, digit value + 1 from bit 8 (0: not a digit).
ROLE_MASK, STRUCT_BIT, SKIP_BIT, IMAGE_BIT, VALUE_SHIFT = 0xF, 1 << 4, 1 << 5, 1 << 6, 8


def _pack(roles: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """STRUCT: start / end; SKIP: ignored or episode (never opens a cut-off span); IMAGE: image or ignored."""
    def any_of(*rs):
        return sum((roles == int(r)).long() for r in rs)

    return (roles | any_of(Role.START, Role.END) * STRUCT_BIT | any_of(Role.IGNORED, Role.EPISODE) * SKIP_BIT
            | any_of(Role.IMAGE, Role.IGNORED) * IMAGE_BIT | (values + 1) << VALUE_SHIFT)


SPECIAL_TOKENS = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "<eos>"}


def build_tokenizer(config: CodecConfig | None = None, extra_tokens: Sequence[str] = ()):
    """An offline ``PreTrainedTokenizerFast`` (WordLevel) whose vocabulary is exactly the event format.

    Ids: ``<pad>`` 0, ``<unk>`` 1, ``<eos>`` 2, then the event tokens, image / episode tokens, ``extra_tokens``.
    Text splits at every ``<...>``; ``decode`` joins tokens without spaces, so ``decode(encode(s)) == s``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    c = config or CodecConfig()
    words = dict.fromkeys([*SPECIAL_TOKENS.values(), *c.event_tokens, *c.extra_tokens, *extra_tokens])
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[^<>]*>"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIAL_TOKENS)


class VocabMap:
    """Token id -> (`Role`, digit value) lookup tables for a tokenizer that has the event tokens.

    Works with any HF tokenizer whose vocabulary holds the format's tokens (as OWA training adds them with
    ``tokenizer.add_tokens``). Negative ids (-100) map to ``Role.IGNORED``, ids past the vocabulary to OTHER.
    """

    def __init__(self, vocab: dict[str, int], config: CodecConfig | None = None, size: Optional[int] = None):
        self.config = c = config or CodecConfig()
        missing = [t for t in c.event_tokens if t not in vocab]
        if missing:
            shown = ", ".join(missing[:10]) + (f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
            raise ValueError(
                f"the tokenizer lacks OWA event tokens: {shown}. Add them with "
                "tokenizer.add_tokens(list(owa_metrics.CodecConfig().event_tokens)) and resize the model's "
                "embeddings, or build one with owa_metrics.build_tokenizer(); if your tokens are named "
                "differently, pass a matching CodecConfig."
            )
        self.size = max(size or 0, max(vocab.values()) + 1)
        named = {
            c.event_start: Role.START, c.event_end: Role.END, c.keyboard_token: Role.KEYBOARD,
            c.mouse_token: Role.MOUSE, c.screen_token: Role.SCREEN, c.press_token: Role.PRESS,
            c.release_token: Role.RELEASE, c.episode_start: Role.EPISODE, c.episode_end: Role.EPISODE,
            **{t: Role.IMAGE for t in c.image_role_tokens}, **{c.digit(i): Role.DIGIT for i in range(c.num_digit_tokens)},
        }
        self.ids = {token: vocab[token] for token in named if token in vocab}
        # codes[id + 1]: index 0 is an ignored label (any negative id), the last index any id past the vocabulary
        roles = torch.full((self.size + 2,), int(Role.OTHER), dtype=torch.int64)
        values = torch.full((self.size + 2,), -1, dtype=torch.int64)
        for token, token_id in self.ids.items():
            roles[token_id + 1] = int(named[token])
        for i in range(c.num_digit_tokens):
            values[vocab[c.digit(i)] + 1] = i
        roles[0] = int(Role.IGNORED)
        self.codes_table = _pack(roles, values).to(torch.int32)
        self._id_to_token = {i: t for t, i in vocab.items()}
        self._tables: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer, config: CodecConfig | None = None) -> "VocabMap":
        """From any HF tokenizer (``get_vocab()`` includes added tokens)."""
        return cls(tokenizer.get_vocab(), config, size=len(tokenizer))

    def codes(self, ids: torch.Tensor) -> torch.Tensor:
        """Packed per-token codes shaped like ``ids``, on its device: role, flag bits and digit value (see `_pack`)."""
        table = self._tables.get(ids.device)
        if table is None:
            table = self._tables[ids.device] = self.codes_table.to(ids.device)
        index = (ids.reshape(-1).clamp(-1, self.size) + 1).long()
        return table.index_select(0, index).view(ids.shape)

    def lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(role, digit_value)`` tensors shaped like ``ids``, on its device (digit_value -1 for non-digits)."""
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
                                     "the CodecConfig (image_prefix, image_token, image_suffix)")
        return out
