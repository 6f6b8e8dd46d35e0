"""A token format as data: which tokens exist, and each event layout slot by slot.

An event is ``<EVENT_START> TYPE slot slot ... <EVENT_END>``. A `Layout` lists the slots between the type
token and ``<EVENT_END>``; a `Slot` accepts one token family (a `Role`: digit, sign, VK, MB hex digit,
press/release, or a run of image tokens) with values below ``bound``, and adds ``value * place`` to its
field, or makes the field negative (``sign``). A field's number is

    value = (-1)^minus * sum(slot value * place)        then, with a modulus M: value - M if value >= M / 2

The string codec (`EventCodec`, the readable reference) and the batch decoder (``owa_metrics.decode``) both
read this table; neither has a branch per format. Two formats are built from a `CodecConfig`'s numbers:
``hierarchical`` (digits ``<0>``..``<255>``, dx / dy modulo 4000 with their digits interleaved) and
``factorized`` (digits ``<0>``..``<9>``, sign tokens, ``<VK_n>``, ``<MB_h>``), upstream OWA's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ..schema import Kind, Role

FIELDS = ("timestamp", "vk", "action", "dx", "dy", "button_flags", "scroll")
KINDS = tuple(k.name.lower() for k in Kind)


@dataclass(frozen=True)
class Slot:
    """One token of a layout: the family it accepts (values < ``bound``) and what it adds to ``field``."""

    role: Role
    bound: int = 0
    field: Optional[str] = None
    place: int = 0
    sign: bool = False  # the token's value 1 makes the field negative

    @property
    def run(self) -> bool:
        """A run of image tokens (or ignored labels) of any length: a screen's data."""
        return self.role == Role.IMAGE


@dataclass(frozen=True)
class Layout:
    """The slots of one event layout between the type token and ``<EVENT_END>``.

    ``extends``: the index of the layout this one continues (same kind, same first slots): it is chosen when
    the token after the shorter layout's slots belongs to this layout's next slot's family (a mouse event
    with a scroll).
    """

    kind: str
    slots: tuple[Slot, ...]
    extends: Optional[int] = None


# Field policies when encoding a number out of the format's range
WRAP, CLAMP, REFUSE = "wrap", "clamp", "refuse"


@dataclass(frozen=True)
class TokenFormat:
    """A format's vocabulary (token -> role and value), layouts, field moduli and encoding policies."""

    name: str
    tokens: dict[str, tuple[Role, int]]
    layouts: tuple[Layout, ...]
    modulus: dict[str, int] = field(default_factory=dict)  # signed by modulus (two's-complement style)
    policy: dict[str, str] = field(default_factory=dict)
    timestamp_unit_ns: int = 10_000_000
    scroll_unit: int = 120

    def __post_init__(self) -> None:
        families: dict[Role, dict[int, str]] = {}
        for token, (role, value) in self.tokens.items():
            families.setdefault(role, {})[value] = token
        index = {}
        for i, lay in enumerate(self.layouts):
            index.setdefault((lay.kind, False), i) if lay.extends is None else index.setdefault((lay.kind, True), i)
        for kind, extended in list(index):
            index.setdefault((kind, True), index[kind, False])
        ranges = {}
        for lay in self.layouts:
            for name in {s.field for s in lay.slots} - {None} - set(ranges):
                ranges[name] = self._range(name, [s for s in lay.slots if s.field == name])
        object.__setattr__(self, "families", families)
        object.__setattr__(self, "_layout_index", index)
        object.__setattr__(self, "_ranges", ranges)

    @property
    def event_tokens(self) -> tuple[str, ...]:
        """The tokens a tokenizer must have for this format, in a stable order."""
        return tuple(self.tokens)

    def token(self, role: Role, value: int = 0) -> str:
        return self.families[role][value]

    def layout_index(self, kind: str, extended: bool = False) -> int:
        """The kind's first layout, or the layout that extends it."""
        return self._layout_index[kind, extended]

    def field_range(self, name: str) -> tuple[int, int]:
        """The numbers a field can hold: sign + magnitude, modulus (signed) or plain digits (unsigned)."""
        return self._ranges[name]

    def _range(self, name: str, slots: list[Slot]) -> tuple[int, int]:
        total = math.prod(s.bound for s in slots if not s.sign)
        if any(s.sign for s in slots):
            return -(total - 1), total - 1
        if name in self.modulus:
            return -(total // 2), total // 2 - 1
        return 0, total - 1

    def slot_values(self, layout: Layout, numbers: dict[str, int]) -> list[int]:
        """Each slot's token value for the field ``numbers`` (already in range; a run slot gets 0)."""
        out = []
        for s in layout.slots:
            number = numbers.get(s.field, 0)
            if s.sign:
                out.append(int(number < 0))
            elif s.field is None:
                out.append(0)
            else:
                magnitude = number % self.modulus[s.field] if s.field in self.modulus else abs(number)
                out.append(magnitude // s.place % s.bound)
        return out

    def field_numbers(self, layout: Layout, values: list[int]) -> dict[str, int]:
        """Inverse of `slot_values`: the formula of the module docstring, per field."""
        total: dict[str, int] = {}
        minus: dict[str, bool] = {}
        for s, v in zip(layout.slots, values):
            if s.field is None:
                continue
            if s.sign:
                minus[s.field] = v == 1
            else:
                total[s.field] = total.get(s.field, 0) + v * s.place
        for name, value in total.items():
            if minus.get(name):
                value = -value
            m = self.modulus.get(name)
            total[name] = value - m if m and value >= m // 2 else value
        return total

    @property
    def digit_columns(self) -> tuple[str, ...]:
        """The fields whose token values digit precision compares, one entry per level: the timestamp's, dx's
        and dy's slots of the mouse layout (a sign token first)."""
        mouse = self.layouts[self.layout_index("mouse")]
        return tuple(name for name in ("timestamp", "dx", "dy") for s in mouse.slots if s.field == name)

    def window_slots(self, kind: str) -> list[Optional[str]]:
        """The field of each token of the kind's first layout, from ``<EVENT_START>`` (slot 0) to ``<EVENT_END>``."""
        return [None, None, *(s.field for s in self.layouts[self.layout_index(kind)].slots), None]


def _number(role: Role, name: str, bases, sign: bool = False, sign_role: Role = Role.SIGN) -> list[Slot]:
    """A field written as (an optional sign token then) digits over ``bases``, most significant first."""
    bases = [int(b) for b in bases]
    places = [math.prod(bases[i + 1:]) for i in range(len(bases))]
    head = [Slot(sign_role, 2, name, 0, sign=True)] if sign else []
    return head + [Slot(role, b, name, p) for b, p in zip(bases, places)]


def hierarchical(c) -> TokenFormat:
    """Digits ``<0>``..``<N-1>`` for everything; dx and dy modulo R, their digits interleaved dx0 dy0 dx1 dy1 ..."""
    _check_bases(c, c.num_digit_tokens, ("timestamp_bases", "mouse_delta_bases", "button_flag_bases", "scroll_bases"))
    tokens = _structure(c)
    tokens.update({c.digit_format.format(i): (Role.DIGIT, i) for i in range(c.num_digit_tokens)})
    ts = _number(Role.DIGIT, "timestamp", c.timestamp_bases)
    dx, dy = _number(Role.DIGIT, "dx", c.mouse_delta_bases), _number(Role.DIGIT, "dy", c.mouse_delta_bases)
    deltas = [s for pair in zip(dx, dy) for s in pair]
    mouse = (*ts, *deltas, *_number(Role.DIGIT, "button_flags", c.button_flag_bases))
    layouts = (
        Layout("keyboard", (*ts, Slot(Role.DIGIT, c.num_digit_tokens, "vk", 1), Slot(Role.ACTION, 2, "action", 1))),
        Layout("mouse", mouse),
        Layout("mouse", (*mouse, *_number(Role.DIGIT, "scroll", c.scroll_bases)), extends=1),
        Layout("screen", (*ts, Slot(Role.IMAGE))),
    )
    modulus = {"dx": math.prod(c.mouse_delta_bases), "dy": math.prod(c.mouse_delta_bases),
               "scroll": math.prod(c.scroll_bases)}
    return TokenFormat("hierarchical", tokens, layouts, modulus,
                       {"timestamp": WRAP, "dx": CLAMP, "dy": CLAMP, "scroll": CLAMP, "vk": REFUSE,
                        "button_flags": REFUSE}, c.timestamp_unit_ns, c.scroll_unit)


def factorized(c) -> TokenFormat:
    """Digits ``<0>``..``<9>``, ``<SIGN_PLUS>`` / ``<SIGN_MINUS>``, ``<VK_n>`` keys and ``<MB_h>`` button-flag digits."""
    _check_bases(c, c.num_digit_tokens, ("timestamp_bases", "mouse_delta_bases", "scroll_bases"))
    _check_bases(c, c.num_mb_tokens, ("button_flag_bases",))
    tokens = _structure(c)
    tokens.update({c.digit_format.format(i): (Role.DIGIT, i) for i in range(c.num_digit_tokens)})
    tokens.update({t: (Role.SIGN, i) for i, t in enumerate(c.sign_tokens)})
    tokens.update({c.vk_format.format(i): (Role.VK, i) for i in range(c.num_vk_tokens)})
    tokens.update({c.mb_format.format(i): (Role.MB, i) for i in range(c.num_mb_tokens)})
    ts = _number(Role.DIGIT, "timestamp", c.timestamp_bases)
    mouse = (*ts, *_number(Role.DIGIT, "dx", c.mouse_delta_bases, sign=True),
             *_number(Role.DIGIT, "dy", c.mouse_delta_bases, sign=True), *_number(Role.MB, "button_flags", c.button_flag_bases))
    layouts = (
        Layout("keyboard", (*ts, Slot(Role.VK, c.num_vk_tokens, "vk", 1), Slot(Role.ACTION, 2, "action", 1))),
        Layout("mouse", mouse),
        Layout("mouse", (*mouse, *_number(Role.DIGIT, "scroll", c.scroll_bases, sign=True)), extends=1),
        Layout("screen", (*ts, Slot(Role.IMAGE))),
    )
    return TokenFormat("factorized", tokens, layouts, {},
                       {"timestamp": WRAP, "dx": CLAMP, "dy": CLAMP, "scroll": REFUSE, "vk": REFUSE,
                        "button_flags": REFUSE}, c.timestamp_unit_ns, c.scroll_unit)


FORMATS = {"hierarchical": hierarchical, "factorized": factorized}


def _structure(c) -> dict[str, tuple[Role, int]]:
    return {c.event_start: (Role.START, 0), c.event_end: (Role.END, 0), c.keyboard_token: (Role.KEYBOARD, 0),
            c.mouse_token: (Role.MOUSE, 0), c.screen_token: (Role.SCREEN, 0), c.press_token: (Role.ACTION, 0),
            c.release_token: (Role.ACTION, 1)}


def _check_bases(c, limit: int, names) -> None:
    for name in names:
        bases = getattr(c, name)
        if not bases or min(bases) < 2 or max(bases) > limit:
            raise ValueError(f"CodecConfig.{name} must be bases in [2, {limit}] for the {c.format} format, got {bases}")
