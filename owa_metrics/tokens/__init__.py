"""Tokens: the OWA event token formats (a table per format, a string codec) and the tokenizer's vocabulary map."""

from .codec import (
    CodecConfig, DecodedEvent, EventCodec, EventDecodeError, EventEncodeError, from_digits, split_tokens, to_digits,
)
from .data import collate, token_sequences
from .format import FORMATS, Layout, Role, Slot, TokenFormat
from .vocab import IMAGE_CONVENTIONS, VocabMap, build_tokenizer, detect_format

__all__ = [
    "CodecConfig", "DecodedEvent", "EventCodec", "EventDecodeError", "EventEncodeError", "FORMATS",
    "IMAGE_CONVENTIONS", "Layout", "Role", "Slot", "TokenFormat", "VocabMap", "build_tokenizer", "detect_format",
    "collate", "from_digits", "split_tokens", "to_digits", "token_sequences",
]
