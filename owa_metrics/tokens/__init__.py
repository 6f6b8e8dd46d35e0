"""Tokens: the OWA event token format (string codec) and the tokenizer's vocabulary map."""

from .codec import CodecConfig, DecodedEvent, EventCodec, EventDecodeError, from_digits, split_tokens, to_digits
from .vocab import Role, VocabMap, build_tokenizer

__all__ = [
    "CodecConfig", "DecodedEvent", "EventCodec", "EventDecodeError", "Role", "VocabMap", "build_tokenizer",
    "from_digits", "split_tokens", "to_digits",
]
