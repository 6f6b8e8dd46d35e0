"""Tokens: the OWA event token formats (a table per format, the registry, a string codec) and the tokenizer's
vocabulary map. Names are imported on first use, so that the registry (`codec`) loads without torch."""

import importlib

_EXPORTS = {
    **dict.fromkeys(["CodecConfig", "DecodedEvent", "EventCodec", "EventDecodeError", "EventEncodeError", "FORMATS",
                     "FormatSpec", "from_digits", "register_format", "split_tokens", "to_digits"], "codec"),
    **dict.fromkeys(["collate", "token_sequences"], "data"),
    **dict.fromkeys(["Layout", "Role", "Slot", "TokenFormat"], "format"),
    **dict.fromkeys(["IMAGE_CONVENTIONS", "VocabMap", "build_tokenizer", "detect_format"], "vocab"),
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
