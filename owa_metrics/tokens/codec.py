"""The OWA event token formats, as a readable per-event string codec.

An event is ``<EVENT_START> TYPE TIMESTAMP DATA <EVENT_END>``; the slots of each layout and what they mean
are the format's table (`owa_metrics.tokens.format`), which this codec walks token by token. The formats are
registered here (`register_format`: a name, a table builder, a preset); two come with the package:

- ``hierarchical`` (the default): TIMESTAMP ``timestamp_ns // 10 ms`` modulo 1600 over bases 16, 10, 10 (a
  16 s window); KEYBOARD ``<vk>`` ``<press>|<release>``; MOUSE dx, dy modulo 4000 over bases 2, 20, 10, 10,
  interleaved dx0 dy0 dx1 dy1 ..., 3 hex digits of button_flags, then only when button_data != 0
  ``signed16(button_data) // 120`` over bases 2, 10; digits ``<0>``..``<255>``.
- ``factorized`` (upstream OWA's default): TIMESTAMP 3 decimal digits of the 10 ms units modulo 1000 (a 10 s
  window); KEYBOARD ``<VK_n>`` ``<press>|<release>``; MOUSE a sign token then 4 digits of |dx| over bases
  2, 10, 10, 10, the same for dy, button_flags as 3 ``<MB_h>``, then only when button_data != 0 a sign and
  one digit of the wheel steps (-9..9); digits ``<0>``..``<9>``.

SCREEN: ``<fake_image_placeholder>`` in the text form, or prefix + N image tokens + suffix in token ids.
This module is the reference: the vectorized batch decoder (``owa_metrics.decode``) must agree with it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

from ..schema import TYPE_ROLES, Event, Role, Status
from .format import CLAMP, KINDS, REFUSE, TokenFormat, factorized, hierarchical

_TOKEN_RE = re.compile(r"<[^<>]*>|[^<]+|<")


@dataclass(frozen=True)
class CodecConfig:
    """Every number and token of a format; the defaults are the upstream OWA hierarchical encoder's.

    ``CodecConfig.preset("factorized")`` gives upstream's factorized encoder; ``format`` names the registered
    format (`FORMATS`) whose table builder reads these numbers.
    """

    format: str = "hierarchical"
    event_start: str = "<EVENT_START>"
    event_end: str = "<EVENT_END>"
    keyboard_token: str = "<KEYBOARD>"
    mouse_token: str = "<MOUSE>"
    screen_token: str = "<SCREEN>"
    press_token: str = "<press>"
    release_token: str = "<release>"
    digit_format: str = "<{}>"
    num_digit_tokens: int = 256
    sign_tokens: tuple[str, str] = ("<SIGN_PLUS>", "<SIGN_MINUS>")  # factorized only
    vk_format: str = "<VK_{}>"  # factorized only
    num_vk_tokens: int = 256
    mb_format: str = "<MB_{}>"  # factorized only
    num_mb_tokens: int = 16
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
        if self.format not in FORMATS:
            raise ValueError(f"CodecConfig.format must be one of {sorted(FORMATS)}, got {self.format!r}")
        for name in ("timestamp_bases", "mouse_delta_bases", "button_flag_bases", "scroll_bases"):
            object.__setattr__(self, name, tuple(int(b) for b in getattr(self, name)))
        for name in ("image_prefix", "image_suffix", "sign_tokens"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self.token_format  # noqa: B018 - checks the numbers against the format now, not at first use

    @classmethod
    def preset(cls, name: str, **overrides) -> "CodecConfig":
        """A registered format's preset (``"hierarchical"`` = ``CodecConfig()``, ``"factorized"``: upstream OWA's
        defaults), with ``overrides``."""
        if name not in FORMATS:
            raise ValueError(f"unknown format {name!r}: choose one of {sorted(FORMATS)}")
        return replace(FORMATS[name].preset, **overrides)

    @classmethod
    def from_dict(cls, data: dict) -> "CodecConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown CodecConfig keys {sorted(unknown)}; known keys: {sorted(known)}")
        return cls(**data)

    @cached_property
    def token_format(self) -> TokenFormat:
        """The format's table: vocabulary and layouts (see `owa_metrics.tokens.format`)."""
        return FORMATS[self.format].build(self)

    @property
    def timestamp_window_ns(self) -> int:
        return math.prod(self.timestamp_bases) * self.timestamp_unit_ns

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
        return self.token_format.event_tokens

    @property
    def extra_tokens(self) -> tuple[str, ...]:
        """Image and episode tokens, in a stable order without repeats."""
        seq = (self.screen_placeholder, *self.image_prefix, self.image_token, *self.image_suffix,
               self.episode_start, self.episode_end)
        return tuple(dict.fromkeys(seq))

    @property
    def image_description(self) -> str:
        """``<img> <IMG_CONTEXT> x 256 </img>``: the image tokens of a screen, in words."""
        return " ".join([*self.image_prefix, f"{self.image_token} x {self.image_token_count}", *self.image_suffix])


@dataclass(frozen=True)
class FormatSpec:
    """A registered token format: its ``name`` (``CodecConfig.format``, the CLI's ``--format``), ``build`` (a
    CodecConfig -> its `TokenFormat` table) and ``defaults``, the CodecConfig fields of its preset. What tells it
    from the others is read from the preset's table: its event tokens in a vocabulary (``detect_format``), the
    tokens only it writes in a text (`possible_formats`)."""

    name: str
    build: Callable[[CodecConfig], TokenFormat]
    defaults: dict

    @cached_property
    def preset(self) -> CodecConfig:
        return CodecConfig(format=self.name, **self.defaults)


FORMATS: dict[str, FormatSpec] = {}  # the registry, in registration order (`register_format`)


def register_format(name: str, build: Callable[[CodecConfig], TokenFormat], **defaults) -> FormatSpec:
    """Register the token format ``name``: its table builder and its preset's CodecConfig fields (the others keep
    CodecConfig's defaults). That is all a format needs: the codec, the batch decoder, ``detect_format``,
    ``guess_format`` and the CLI read the registry. The preset's table is built now: one the batch decoder cannot
    read is refused with a ValueError (`TokenFormat`) and not registered."""
    if name in FORMATS:
        raise ValueError(f"a token format named {name!r} is registered already")
    FORMATS[name] = spec = FormatSpec(name, build, defaults)
    try:
        spec.preset  # noqa: B018 - builds and checks the table
    except Exception:
        del FORMATS[name]
        raise
    return spec


register_format("hierarchical", hierarchical)
register_format("factorized", factorized, num_digit_tokens=10, timestamp_bases=(10, 10, 10),
                mouse_delta_bases=(2, 10, 10, 10), scroll_bases=(10,))


def possible_formats(tokens: set[str]) -> list[str]:
    """The registered formats that can have written a text holding ``tokens``: not one that lacks a token another
    format writes, nor one that writes a token of its own in every event of a kind (factorized: a ``<VK_n>`` in
    every key event, a sign in every mouse event) when the text holds that kind's type token and none of its own."""
    tables = {name: spec.preset.token_format for name, spec in FORMATS.items()}
    out = []
    for name, fmt in tables.items():
        others = set().union(*(t.tokens for n, t in tables.items() if n != name))
        own, foreign = fmt.tokens.keys() - others, others - fmt.tokens.keys()

        def marked(slot) -> bool:  # every token the slot accepts is the format's own
            family = {t for v, t in fmt.families.get(slot.role, {}).items() if v < slot.bound}
            return bool(family) and family <= own

        typed = {fmt.token(TYPE_ROLES[k]) for k in KINDS
                 if all(any(map(marked, lay.slots)) for lay in fmt.layouts if lay.kind == k)}
        if not tokens & foreign and (tokens & own or not tokens & typed):
            out.append(name)
    return out


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


class EventEncodeError(ValueError):
    """An event the format cannot write (a vk without a token, button flags or a scroll out of range)."""


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


_KIND_OF_ROLE = {role: kind for kind, role in TYPE_ROLES.items()}


class EventCodec:
    """Encode `Event` objects to token strings and decode them back (the readable per-event reference)."""

    def __init__(self, config: CodecConfig | None = None):
        self.config = config or CodecConfig()
        self.format = self.config.token_format
        self._role = dict(self.format.tokens)
        self._role.update({t: (Role.IMAGE, 0) for t in self.config.image_role_tokens})
        self._image_data = {None, *self.config.image_role_tokens}
        self._skip = {None, self.config.episode_start, self.config.episode_end}

    # ----------------------------------------------------------------------------------------- encode
    def tokens(self, event: Event, expand_images: bool = False) -> list[str]:
        """The token strings of one event; ``expand_images`` writes a screen's image tokens, not the placeholder.

        Raises `EventEncodeError` for a number the format cannot write (see the format's field policies).
        """
        fmt, c = self.format, self.config
        layout = fmt.layouts[fmt.layout_index(event.kind, extended=bool(event.kind == "mouse" and event.button_data))]
        numbers = self._numbers(event)
        out = [c.event_start, fmt.token(TYPE_ROLES[event.kind])]
        for slot, value in zip(layout.slots, fmt.slot_values(layout, numbers)):
            if slot.run:
                out += list(c.image_tokens) if expand_images else [c.screen_placeholder]
            else:
                out.append(fmt.token(slot.role, value))
        out.append(c.event_end)
        return out

    def _numbers(self, event: Event) -> dict[str, int]:
        """The event's field numbers, brought into the format's range by each field's policy."""
        fmt = self.format
        raw = {"timestamp": event.timestamp_ns // fmt.timestamp_unit_ns}
        if event.kind == "keyboard":
            raw.update(vk=event.vk, action=int(event.action == "release"))
        elif event.kind == "mouse":
            raw.update(dx=int(event.dx), dy=int(event.dy), button_flags=event.button_flags)
            if event.button_data:
                raw["scroll"] = signed16(event.button_data) // fmt.scroll_unit
        out = {}
        for name, value in raw.items():
            if name == "action":
                out[name] = value
                continue
            low, high = fmt.field_range(name)
            policy = fmt.policy[name]
            if policy == CLAMP:
                value = min(max(value, low), high)
            elif policy == REFUSE and not low <= value <= high:
                raise EventEncodeError(f"{name} must be in [{low}, {high}] in the {fmt.name} format, got {value}")
            out[name] = value % (high + 1) if low == 0 else value
        return out

    def fit(self, event: Event) -> Event:
        """``event`` with dx, dy and the wheel steps clamped into the format's range, so that it encodes."""
        if event.kind != "mouse":
            return event
        fmt = self.format
        clamp = lambda name, v: min(max(v, fmt.field_range(name)[0]), fmt.field_range(name)[1])  # noqa: E731
        steps = signed16(event.button_data) // fmt.scroll_unit
        data = event.button_data if not event.button_data or clamp("scroll", steps) == steps \
            else clamp("scroll", steps) * fmt.scroll_unit
        return replace(event, dx=clamp("dx", event.dx), dy=clamp("dy", event.dy), button_data=data)

    def encode(self, event: Event) -> str:
        """``Event`` -> its text form, e.g. ``<EVENT_START><KEYBOARD><1><2><3><65><press><EVENT_END>``."""
        return "".join(self.tokens(event))

    def digits(self, event: Event) -> dict[str, list[int]]:
        """The token values of each field of a valid event, in slot order (a sign token first): the digits that
        digit-precision accuracy compares level by level."""
        fmt = self.format
        layout = fmt.layouts[fmt.layout_index(event.kind)]
        out: dict[str, list[int]] = {}
        for slot, value in zip(layout.slots, fmt.slot_values(layout, self._numbers(event))):
            out.setdefault(slot.field, []).append(value)
        return out

    # ----------------------------------------------------------------------------------------- decode
    def kind_of(self, token: Optional[str]) -> Optional[str]:
        """The event kind a type token names ("keyboard" | "mouse" | "screen"), None for any other token."""
        return _KIND_OF_ROLE.get(self._role.get(token, (None,))[0])

    def decode(self, text: str) -> Event:
        """One event string -> ``Event``; raises `EventDecodeError` (with a `Status`) on malformed input."""
        return self.decode_tokens(split_tokens(text))

    def decode_tokens(self, tokens: Sequence[Optional[str]]) -> Event:
        """One event's tokens (``None`` = an ignored label, e.g. -100) -> ``Event``; raises `EventDecodeError`.

        Walks the layout of the type token slot by slot; a mouse layout continues into its scroll layout when
        the token after its slots belongs to the scroll's first slot's family.
        """
        c, fmt = self.config, self.format
        cur = _Cursor(tokens, c.event_end)
        cur.take(lambda t: t == c.event_start, "<EVENT_START>")
        kind = self.kind_of(cur.take(lambda t: self.kind_of(t) is not None, "a type token"))
        index = fmt.layout_index(kind)
        longer = fmt.layouts[fmt.layout_index(kind, extended=True)]
        layout, values, i = fmt.layouts[index], [], 0
        while i < len(layout.slots):
            slot = layout.slots[i]
            if slot.run:
                first = cur.pos
                while cur.pos < len(tokens) and tokens[cur.pos] in self._image_data:
                    cur.pos += 1  # image tokens, or their ignored labels
                if cur.pos == first:
                    cur.take(lambda t: False, "image data")  # raises with the status of what stands there
                values.append(0)
            else:
                token = cur.take(lambda t, s=slot: self._accepts(s, t), slot)
                values.append(self._role[token][1])
            i += 1
            if i == len(layout.slots) and len(longer.slots) > i and self._role_of(cur.peek()) == longer.slots[i].role:
                layout = longer
        numbers = fmt.field_numbers(layout, values)
        timestamp_ns = numbers["timestamp"] * fmt.timestamp_unit_ns
        cur.take(lambda t: t == c.event_end, "<EVENT_END>", end_expected=True)
        if not cur.at_end():
            raise EventDecodeError(Status.INVALID_FORMAT, cur.pos, f"extra tokens after <EVENT_END>: {cur.peek()!r}")
        if kind == "keyboard":
            return Event(kind="keyboard", timestamp_ns=timestamp_ns, vk=numbers["vk"],
                         action="release" if numbers["action"] else "press")
        if kind == "mouse":
            return Event(kind="mouse", timestamp_ns=timestamp_ns, dx=numbers["dx"], dy=numbers["dy"],
                         button_flags=numbers["button_flags"], button_data=numbers.get("scroll", 0) * fmt.scroll_unit)
        return Event(kind="screen", timestamp_ns=timestamp_ns)

    def _role_of(self, token: Optional[str]) -> Optional[Role]:
        return self._role.get(token, (None,))[0]

    def _accepts(self, slot, token: str) -> bool:
        role, value = self._role.get(token, (None, 0))
        return role == slot.role and value < slot.bound

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

    def take(self, ok, what, end_expected: bool = False) -> Optional[str]:
        """The next token if ``ok(token)``; else raises, saying ``what`` (a text, or the `Slot`) was expected."""
        if self.pos < len(self.tokens) and self.tokens[self.pos] is not None and ok(self.tokens[self.pos]):
            self.pos += 1
            return self.tokens[self.pos - 1]
        if not isinstance(what, str):
            what = f"a {what.role.name.lower()} token < {what.bound}"
        if self.at_end():
            raise EventDecodeError(Status.TRUNCATED, self.pos, f"sequence ended where {what} was expected")
        token = self.tokens[self.pos]
        if token is None or (token == self.end_token and not end_expected):
            label = "an ignored label" if token is None else "<EVENT_END>"
            raise EventDecodeError(Status.MISSING_FIELDS, self.pos, f"{label} where {what} was expected")
        raise EventDecodeError(Status.INVALID_FORMAT, self.pos, f"{token!r} where {what} was expected")
