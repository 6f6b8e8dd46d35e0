"""A token format as data: which tokens exist, and each event layout slot by slot.

An event is ``<EVENT_START> TYPE slot slot ... <EVENT_END>``. A `Layout` lists the slots between the type
token and ``<EVENT_END>``; a `Slot` accepts one token family (a `Role`: digit, sign, VK, MB hex digit,
press/release, or a run of image tokens) with values below ``bound``, and adds ``value * place`` to its
field, or makes the field negative (``sign``). A field's number is

    value = (-1)^minus * sum(slot value * place)        then, with a modulus M: value - M if value >= M / 2

The string codec (`EventCodec`, the readable reference) and the batch decoder (``owa_metrics.decode``) both
read this table; neither has a branch per format. A table is checked against what the batch decoder can read
when it is built (`TokenFormat._check_decoder_limits`). Two formats are built from a `CodecConfig`'s numbers
(registered in `owa_metrics.tokens.codec`): ``hierarchical`` (digits ``<0>``..``<255>``, dx / dy modulo 4000 with
their digits interleaved) and ``factorized`` (digits ``<0>``..``<9>``, sign tokens, ``<VK_n>``, ``<MB_h>``),
upstream OWA's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ..schema import VALUE_SHIFT, Kind, Role

FIELDS = ("timestamp", "vk", "action", "dx", "dy", "button_flags", "scroll")
KINDS = tuple(k.name.lower() for k in Kind)
VALUED = (Role.DIGIT, Role.ACTION, Role.SIGN, Role.VK, Role.MB)  # families whose tokens carry a value
# the fields an event of each kind must have (the decoders read 0 for a field its layout lacks)
KIND_FIELDS = {"keyboard": {"timestamp", "vk", "action"}, "mouse": {"timestamp", "dx", "dy", "button_flags"},
               "screen": {"timestamp"}}

# What the batch decoder (`owa_metrics.decode`) can read; `TokenFormat` refuses a table beyond it when built.
MAX_BOUND = 0x7FFF  # a slot's value bound: bits 16-30 of its int32 rule
MAX_RULES = 15  # distinct slot rules: 2 verdict bits each in an int32 token plane
FIXED_RULES = 6  # rules the decoder adds: start, type, end, the slot after the end, image data, "anything"
MAX_VALUE = (1 << (31 - VALUE_SHIFT)) - 2  # a token's value + 1, shifted by VALUE_SHIFT, in an int32 code
MAX_EXACT = 1 << 53  # a field's largest number in its unit (ns, scroll steps): float64 reads it exactly


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
        self._check_decoder_limits()

    def _check_decoder_limits(self) -> None:
        """Raise a ValueError naming the format and the limit where the batch decoder could not read this table (it
        would fail at the first batch, or decode it wrong): the limits above, and the layouts' shape it reads."""
        def refuse(what: str):
            raise ValueError(f"the {self.name} format's table exceeds the batch decoder's limits: {what}")

        for token, (_, value) in self.tokens.items():
            if not 0 <= value <= MAX_VALUE:
                refuse(f"{token!r} has value {value}: the packed token code holds 0..{MAX_VALUE}")
        for kind in KINDS:
            if (kind, False) not in self._layout_index:
                refuse(f"no {kind} layout (every kind needs one)")
        rules, units = set(), {"timestamp": self.timestamp_unit_ns, "scroll": self.scroll_unit}
        for i, lay in enumerate(self.layouts):
            fields = {s.field for s in lay.slots} - {None}
            if lay.kind not in KINDS or not KIND_FIELDS[lay.kind] <= fields or not fields <= set(FIELDS):
                refuse(f"layout {i} is a {lay.kind!r} layout with fields {sorted(fields)}: a kind of {KINDS} with "
                       f"its fields {sorted(KIND_FIELDS.get(lay.kind, ()))}, and no field outside {FIELDS}")
            if any(s.run for s in lay.slots[:-1]):
                refuse(f"layout {i} has slots after its image run (a run is a layout's last slot)")
            for s in lay.slots:
                if not s.run and (s.role not in VALUED or not 1 <= s.bound <= MAX_BOUND or (s.sign and s.bound != 2)):
                    refuse(f"layout {i} has a {s.role.name} slot with bound {s.bound}: a slot reads a valued family "
                           f"{tuple(r.name for r in VALUED)} below a bound in [1, {MAX_BOUND}] (a sign's is 2)")
                if s.field == "button_flags" and (s.sign or lay.kind != "mouse" or "button_flags" in self.modulus):
                    refuse("button_flags is read as an unsigned field of mouse events (no sign, no modulus)")
            rules |= {(s.role, s.bound) for s in lay.slots if not s.run}
            base = self.layouts[lay.extends] if lay.extends is not None else None
            if base is not None and (lay.extends != self._layout_index[lay.kind, False]
                                     or lay.slots[:len(base.slots)] != base.slots or len(lay.slots) == len(base.slots)):
                refuse(f"layout {i} extends layout {lay.extends}: it must extend its kind's first layout, longer, "
                       "with the same first slots")
            for name in fields:
                top = max(sum((s.bound - 1) * s.place for s in lay.slots if s.field == name and not s.sign),
                          self.modulus.get(name, 0)) * units.get(name, 1)
                if top >= MAX_EXACT:
                    refuse(f"{name} reaches {top} in its unit, not below 2^53 (float64 reads it exactly)")
        if sum(lay.extends is not None for lay in self.layouts) > 1:
            refuse("more than one layout extends another (the decoder reads one)")
        if FIXED_RULES + len(rules) > MAX_RULES:
            refuse(f"{len(rules)} distinct slot rules (role, bound); {MAX_RULES - FIXED_RULES} at most")
        levels = self.digit_columns
        if levels.count("dx") != levels.count("dy"):  # `EventFields` splits the dx and dy levels in halves
            refuse(f"the mouse layout writes dx in {levels.count('dx')} tokens, dy in {levels.count('dy')}: as many")

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


def _structure(c) -> dict[str, tuple[Role, int]]:
    return {c.event_start: (Role.START, 0), c.event_end: (Role.END, 0), c.keyboard_token: (Role.KEYBOARD, 0),
            c.mouse_token: (Role.MOUSE, 0), c.screen_token: (Role.SCREEN, 0), c.press_token: (Role.ACTION, 0),
            c.release_token: (Role.ACTION, 1)}


def _check_bases(c, limit: int, names) -> None:
    for name in names:
        bases = getattr(c, name)
        if not bases or min(bases) < 2 or max(bases) > limit:
            raise ValueError(f"CodecConfig.{name} must be bases in [2, {limit}] for the {c.format} format, got {bases}")
