"""The OWA hierarchical event token format, as a readable per-event string codec.

An event is ``<EVENT_START> TYPE TIMESTAMP DATA <EVENT_END>``:

- TIMESTAMP: ``timestamp_ns // unit`` modulo the window, as mixed-radix digits (default bases 16, 10, 10
  of 10 ms units: a 16 s window, 1.23 s -> ``<1><2><3>``).
- KEYBOARD: ``<vk>`` then ``<press>`` | ``<release>``.
- MOUSE: dx and dy clamped to [-R/2, R/2 - 1] (R = 4000), each written as the digits of ``value mod R``
  over bases 2, 20, 10, 10, interleaved dx0 dy0 dx1 dy1 ...; then button_flags as 3 hex digits; then, only
  when button_data != 0, ``signed16(button_data) // 120`` over bases 2, 10 (range -10..9).
- SCREEN: ``<fake_image_placeholder>`` in the text form, or prefix + N image tokens + suffix in token ids.

This module is the reference: the vectorized batch decoder (``owa_metrics.decode``) must agree with it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Iterator, NamedTuple, Optional, Sequence

from ..events.event import Event, Status

_TOKEN_RE = re.compile(r"<[^<>]*>|[^<]+|<")


@dataclass(frozen=True)
class CodecConfig:
    """Every number and token of the format; the defaults are the upstream OWA hierarchical encoder's."""

    event_start: str = "<EVENT_START>"
    event_end: str = "<EVENT_END>"
    keyboard_token: str = "<KEYBOARD>"
    mouse_token: str = "<MOUSE>"
    screen_token: str = "<SCREEN>"
    press_token: str = "<press>"
    release_token: str = "<release>"
    digit_format: str = "<{}>"
    num_digit_tokens: int = 256
    timestamp_unit_ns: int = 10_000_000
    timestamp_bases: tuple[int, ...] = (16, 10, 10)
    mouse_delta_bases: tuple[int, ...] = (2, 20, 10, 10)
    button_flag_bases: tuple[int, ...] = (16, 16, 16)
    scroll_bases: tuple[int, ...] = (2, 10)
    scroll_unit: int = 120
    screen_placeholder: str = "<fake_image_placeholder>"
    image_prefix: tuple[str, ...] = ("<fake_token_around_image>", "<global-img>")
    image_token: str = "<image>"
    image_token_count: int = 64
    image_suffix: tuple[str, ...] = ("<fake_token_around_image>",)
    episode_start: str = "<EPISODE_START>"
    episode_end: str = "<EPISODE_END>"

    def __post_init__(self) -> None:
        for name in ("timestamp_bases", "mouse_delta_bases", "button_flag_bases", "scroll_bases"):
            bases = tuple(int(b) for b in getattr(self, name))
            object.__setattr__(self, name, bases)
            if not bases or min(bases) < 2 or max(bases) > self.num_digit_tokens:
                raise ValueError(f"CodecConfig.{name} must be bases in [2, {self.num_digit_tokens}], got {bases}")
        for name in ("image_prefix", "image_suffix"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def from_dict(cls, data: dict) -> "CodecConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown CodecConfig keys {sorted(unknown)}; known keys: {sorted(known)}")
        return cls(**data)

    @property
    def timestamp_window_ns(self) -> int:
        return math.prod(self.timestamp_bases) * self.timestamp_unit_ns

    @property
    def mouse_delta_range(self) -> int:
        return math.prod(self.mouse_delta_bases)

    @property
    def mouse_delta_min(self) -> int:
        return -(self.mouse_delta_range // 2)

    @property
    def mouse_delta_max(self) -> int:
        return self.mouse_delta_range // 2 - 1

    @property
    def scroll_range(self) -> int:
        return math.prod(self.scroll_bases)

    def digit(self, value: int) -> str:
        return self.digit_format.format(value)

    @property
    def image_tokens(self) -> tuple[str, ...]:
        """The screen data of the token-id form: prefix, N image tokens, suffix."""
        return self.image_prefix + (self.image_token,) * self.image_token_count + self.image_suffix

    @property
    def image_role_tokens(self) -> frozenset[str]:
        """Tokens allowed in a screen event's data (either form)."""
        return frozenset((self.screen_placeholder, self.image_token, *self.image_prefix, *self.image_suffix))

    @property
    def event_tokens(self) -> tuple[str, ...]:
        """The tokens a tokenizer must have for the format (image and episode tokens are extra)."""
        return (
            self.event_start, self.event_end, self.keyboard_token, self.mouse_token, self.screen_token,
            self.press_token, self.release_token,
        ) + tuple(self.digit(i) for i in range(self.num_digit_tokens))

    @property
    def extra_tokens(self) -> tuple[str, ...]:
        """Image and episode tokens, in a stable order without repeats."""
        seq = (self.screen_placeholder, *self.image_prefix, self.image_token, *self.image_suffix,
               self.episode_start, self.episode_end)
        return tuple(dict.fromkeys(seq))


def to_digits(value: int, bases: Sequence[int]) -> list[int]:
    """Mixed-radix digits of ``value mod prod(bases)``, most significant first."""
    value %= math.prod(bases)
    digits = []
    for base in reversed(bases):
        digits.append(value % base)
        value //= base
    return digits[::-1]


def from_digits(digits: Sequence[int], bases: Sequence[int], signed: bool = False) -> int:
    """Inverse of `to_digits`; ``signed`` maps the upper half of the range to negatives."""
    value = 0
    for d, base in zip(digits, bases):
        value = value * base + d
    total = math.prod(bases)
    return value - total if signed and value >= total // 2 else value


def signed16(value: int) -> int:
    value &= 0xFFFF
    return value - 0x10000 if value >= 0x8000 else value


class EventDecodeError(ValueError):
    """A malformed event string; ``status`` says how (a `Status`), ``position`` at which token."""

    def __init__(self, status: Status, position: int, message: str):
        super().__init__(f"{status.label} at token {position}: {message}")
        self.status = status
        self.position = position


class DecodedEvent(NamedTuple):
    """One event of a sequence: its status, the event when valid, and its token span (inclusive)."""

    status: Status
    event: Optional[Event]
    start: int  # index of <EVENT_START>, or of the first token when the start was cut off
    end: int  # index of the span's last token
    tokens: tuple[Optional[str], ...]


def split_tokens(text: str) -> list[str]:
    """``'<A><B>x'`` -> ``['<A>', '<B>', 'x']``: every ``<...>`` is a token, other text runs are one token each."""
    return _TOKEN_RE.findall(text)


class EventCodec:
    """Encode `Event` objects to token strings and decode them back (the readable per-event reference)."""

    def __init__(self, config: CodecConfig | None = None):
        self.config = config or CodecConfig()
        c = self.config
        self._digit_value = {c.digit(i): i for i in range(c.num_digit_tokens)}
        self._kinds = {c.keyboard_token: "keyboard", c.mouse_token: "mouse", c.screen_token: "screen"}
        self._image_role = c.image_role_tokens
        self._skip = {None, c.episode_start, c.episode_end}

    # ----------------------------------------------------------------------------------------- encode
    def tokens(self, event: Event, expand_images: bool = False) -> list[str]:
        """The token strings of one event; ``expand_images`` writes a screen's image tokens, not the placeholder."""
        c = self.config
        units = event.timestamp_ns // c.timestamp_unit_ns
        out = [c.event_start, {"keyboard": c.keyboard_token, "mouse": c.mouse_token, "screen": c.screen_token}[event.kind]]
        out += [c.digit(d) for d in to_digits(units, c.timestamp_bases)]
        if event.kind == "keyboard":
            if not 0 <= event.vk < c.num_digit_tokens:
                raise ValueError(f"vk must be in [0, {c.num_digit_tokens - 1}], got {event.vk}")
            out += [c.digit(event.vk), c.press_token if event.action == "press" else c.release_token]
        elif event.kind == "mouse":
            dx_digits = to_digits(self._clamp_delta(event.dx), c.mouse_delta_bases)
            dy_digits = to_digits(self._clamp_delta(event.dy), c.mouse_delta_bases)
            for a, b in zip(dx_digits, dy_digits):
                out += [c.digit(a), c.digit(b)]
            flag_range = math.prod(c.button_flag_bases)
            if not 0 <= event.button_flags < flag_range:
                raise ValueError(f"button_flags must be in [0, {flag_range - 1}], got {event.button_flags}")
            out += [c.digit(d) for d in to_digits(event.button_flags, c.button_flag_bases)]
            if event.button_data != 0:
                half = c.scroll_range // 2
                scroll = min(max(signed16(event.button_data) // c.scroll_unit, -half), half - 1)
                out += [c.digit(d) for d in to_digits(scroll, c.scroll_bases)]
        else:
            out += list(c.image_tokens) if expand_images else [c.screen_placeholder]
        out.append(c.event_end)
        return out

    def encode(self, event: Event) -> str:
        """``Event`` -> its text form, e.g. ``<EVENT_START><KEYBOARD><1><2><3><65><press><EVENT_END>``."""
        return "".join(self.tokens(event))

    def _clamp_delta(self, value: int) -> int:
        return min(max(int(value), self.config.mouse_delta_min), self.config.mouse_delta_max)

    # ----------------------------------------------------------------------------------------- decode
    def kind_of(self, token: Optional[str]) -> Optional[str]:
        """The event kind a type token names ("keyboard" | "mouse" | "screen"), None for any other token."""
        return self._kinds.get(token)

    def decode(self, text: str) -> Event:
        """One event string -> ``Event``; raises `EventDecodeError` (with a `Status`) on malformed input."""
        return self.decode_tokens(split_tokens(text))

    def decode_tokens(self, tokens: Sequence[Optional[str]]) -> Event:
        """One event's tokens (``None`` = an ignored label, e.g. -100) -> ``Event``; raises `EventDecodeError`."""
        c = self.config
        cur = _Cursor(tokens, c.event_end)
        cur.take(lambda t: t == c.event_start, "<EVENT_START>")
        kind = self._kinds[cur.take(lambda t: t in self._kinds, "a type token")]
        timestamp_ns = self._number(cur, c.timestamp_bases) * c.timestamp_unit_ns
        if kind == "keyboard":
            vk = self._number(cur, (c.num_digit_tokens,))
            action_token = cur.take(lambda t: t in (c.press_token, c.release_token), "press/release")
            action = "press" if action_token == c.press_token else "release"
            event = Event(kind="keyboard", timestamp_ns=timestamp_ns, vk=vk, action=action)
        elif kind == "mouse":
            pairs = [(self._number(cur, (b,)), self._number(cur, (b,))) for b in c.mouse_delta_bases]
            dx = from_digits([p[0] for p in pairs], c.mouse_delta_bases, signed=True)
            dy = from_digits([p[1] for p in pairs], c.mouse_delta_bases, signed=True)
            flags = self._number(cur, c.button_flag_bases)
            button_data = 0
            if cur.peek() in self._digit_value:
                button_data = self._number(cur, c.scroll_bases, signed=True) * c.scroll_unit
            event = Event(kind="mouse", timestamp_ns=timestamp_ns, dx=dx, dy=dy, button_flags=flags,
                          button_data=button_data)
        else:
            first = cur.pos
            while not cur.at_end() and (cur.peek() is None or cur.peek() in self._image_role):
                cur.pos += 1  # image tokens, or their ignored labels
            if cur.pos == first:
                cur.take(lambda t: False, "image data")  # raises with the status of what stands there
            event = Event(kind="screen", timestamp_ns=timestamp_ns)
        cur.take(lambda t: t == c.event_end, "<EVENT_END>", end_expected=True)
        if not cur.at_end():
            raise EventDecodeError(Status.INVALID_FORMAT, cur.pos, f"extra tokens after <EVENT_END>: {cur.peek()!r}")
        return event

    def _number(self, cur: "_Cursor", bases: Sequence[int], signed: bool = False) -> int:
        digits = []
        for base in bases:
            token = cur.take(lambda t: self._digit_value.get(t, base) < base, f"a digit < {base}")
            digits.append(self._digit_value[token])
        return from_digits(digits, bases, signed)

    def iter_decode(self, text: str | Sequence[Optional[str]]) -> Iterator[DecodedEvent]:
        """Every event of a whole sequence with its status; never raises.

        Spans: each ``<EVENT_START>`` opens one (closed by the next ``<EVENT_END>``, or cut by the next
        ``<EVENT_START>`` / the end of the sequence, trailing ignored / episode tokens excluded); an ``<EVENT_END>``
        with no start since the previous end is a span too, starting at the first token that is not ignored
        (None) or an episode token: the first event of a shifted teacher-forcing target lost its start this
        way, so it is decoded with the start re-inserted.
        """
        tokens = split_tokens(text) if isinstance(text, str) else list(text)
        for start, end, virtual in self.spans(tokens):
            span = tuple(tokens[start:end + 1])
            try:
                event = self.decode_tokens(((self.config.event_start,) if virtual else ()) + span)
                yield DecodedEvent(Status.VALID, event, start, end, span)
            except EventDecodeError as err:
                yield DecodedEvent(err.status, None, start, end, span)

    def spans(self, tokens: Sequence[Optional[str]]) -> list[tuple[int, int, bool]]:
        """``(first, last, start_cut_off)`` token indices of every event span, in order (see `iter_decode`)."""
        c = self.config
        out: list[tuple[int, int, bool]] = []
        open_start: Optional[int] = None
        segment_begin = 0  # first index after the previous <EVENT_END>
        for i, token in enumerate(tokens):
            if token == c.event_start:
                if open_start is not None:
                    out.append((open_start, i - 1, False))
                open_start = i
            elif token == c.event_end:
                if open_start is not None:
                    out.append((open_start, i, False))
                else:
                    first = segment_begin
                    while tokens[first] in self._skip:
                        first += 1
                    out.append((first, i, True))
                open_start = None
                segment_begin = i + 1
        if open_start is not None:
            last = len(tokens) - 1
            while tokens[last] in self._skip:  # trailing ignored labels (padding) / episode end: not the event's
                last -= 1
            out.append((open_start, last, False))
        return out


class _Cursor:
    """Walks one event's tokens; a failed expectation raises `EventDecodeError` with the right status."""

    def __init__(self, tokens: Sequence[Optional[str]], end_token: str):
        self.tokens, self.end_token, self.pos = tokens, end_token, 0

    def at_end(self) -> bool:
        return self.pos >= len(self.tokens)

    def peek(self) -> Optional[str]:
        return None if self.at_end() else self.tokens[self.pos]

    def take(self, ok, what: str, end_expected: bool = False) -> Optional[str]:
        if self.at_end():
            raise EventDecodeError(Status.TRUNCATED, self.pos, f"sequence ended where {what} was expected")
        token = self.tokens[self.pos]
        if token is not None and ok(token):
            self.pos += 1
            return token
        if token is None or (token == self.end_token and not end_expected):
            label = "an ignored label" if token is None else "<EVENT_END>"
            raise EventDecodeError(Status.MISSING_FIELDS, self.pos, f"{label} where {what} was expected")
        raise EventDecodeError(Status.INVALID_FORMAT, self.pos, f"{token!r} where {what} was expected")
