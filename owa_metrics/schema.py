"""The codes every stage shares, in one place: event kinds and categories, decode statuses, token roles, the
packed token code, and the `Event` itself.

Every module reads these, the compiled kernels included (they copy them as constants when compiled; numba's
cache does not see a change here, so ``tests/test_schema.py`` checks the compiled copies against this file).
Nothing in the package is imported here: this is the bottom of the stack
(schema <- tokens <- events <- decode <- functional <- metrics <- callbacks / cli).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, Optional


class Kind(IntEnum):
    """What the type token of an event says (``<KEYBOARD>``, ``<MOUSE>``, ``<SCREEN>``)."""

    KEYBOARD = 0
    MOUSE = 1
    SCREEN = 2


class Category(IntEnum):
    """The event categories every metric is split by; ``INVALID`` is the column of undecodable predictions."""

    KEYBOARD = 0
    MOUSE_OP = 1  # mouse event with button_flags != 0 (click, wheel, ...)
    MOUSE_NOP = 2  # mouse event with button_flags == 0 (pure movement)
    SCREEN = 3
    INVALID = 4


CATEGORY_NAMES = tuple(c.name.lower() for c in Category if c != Category.INVALID)
# the category a type token implies before its fields are read, by Kind (a mouse event is mouse_nop until its
# button flags say otherwise): where an undecodable prediction of a known kind counts
KIND_CATEGORY = (Category.KEYBOARD, Category.MOUSE_NOP, Category.SCREEN)


class Status(IntEnum):
    """Why an event did or did not decode, and how a predicted event compares with its target.

    The first four are per-event decode statuses; the rest only describe a (prediction, target) pair.
    """

    VALID = 0
    INVALID_FORMAT = 1  # a token where it does not belong: wrong type token, non-digit, digit out of range, extra tokens
    MISSING_FIELDS = 2  # <EVENT_END> (or an ignored label) where a field was expected
    TRUNCATED = 3  # the span ran out (next <EVENT_START> or end of sequence) before <EVENT_END>
    TYPE_MISMATCH = 4  # both decode, but to different kinds
    MISSING = 5  # generation: no predicted event at this index
    INVALID_TARGET = 6  # the target event itself does not decode

    @property
    def label(self) -> str:
        return self.name.lower()


class Role(IntEnum):
    """What a token means to the decoder: its family (a token's value is its place in the family)."""

    OTHER = 0
    START = 1
    END = 2
    KEYBOARD = 3  # the three type roles are consecutive, in `Kind` order: kind = role - KEYBOARD
    MOUSE = 4
    SCREEN = 5
    ACTION = 6  # <press> (value 0) / <release> (value 1)
    DIGIT = 7  # <0> ... (value = the digit)
    IMAGE = 8  # screen placeholder, image prefix / image / suffix tokens
    EPISODE = 9  # <EPISODE_START> / <EPISODE_END>
    IGNORED = 10  # a negative id (-100 labels)
    SIGN = 11  # <SIGN_PLUS> (value 0) / <SIGN_MINUS> (value 1)
    VK = 12  # <VK_n> (value n)
    MB = 13  # <MB_h> (value h, a hex digit of button_flags)


TYPE_ROLES = {"keyboard": Role.KEYBOARD, "mouse": Role.MOUSE, "screen": Role.SCREEN}

# A token's packed code (`VocabMap.codes`): role in bits 0-3, flag bits, token value + 1 from bit 8 (0: no value).
# STRUCT: start / end; SKIP: ignored or episode (never opens a cut-off span); IMAGE: image or ignored.
ROLE_MASK, STRUCT_BIT, SKIP_BIT, IMAGE_BIT, VALUE_SHIFT = 0xF, 1 << 4, 1 << 5, 1 << 6, 8

EventKind = Literal["keyboard", "mouse", "screen"]


@dataclass(frozen=True)
class Event:
    """One desktop event; fields a kind does not use are None.

    ``Event(kind="mouse", timestamp_ns=1_230_000_000, dx=-3, dy=64, button_flags=0, button_data=0)``
    """

    kind: EventKind
    timestamp_ns: int
    vk: Optional[int] = None
    action: Optional[Literal["press", "release"]] = None
    dx: Optional[int] = None
    dy: Optional[int] = None
    button_flags: Optional[int] = None
    button_data: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in ("keyboard", "mouse", "screen"):
            raise ValueError(f"Event.kind must be 'keyboard', 'mouse' or 'screen', got {self.kind!r}")
        if self.kind == "keyboard" and (self.vk is None or self.action not in ("press", "release")):
            raise ValueError("a keyboard Event needs vk and action='press' | 'release'")
        if self.kind == "mouse" and (self.dx is None or self.dy is None):
            raise ValueError("a mouse Event needs dx and dy (button_flags and button_data default to 0)")
        if self.kind == "mouse":
            object.__setattr__(self, "button_flags", self.button_flags or 0)
            object.__setattr__(self, "button_data", self.button_data or 0)

    @property
    def category(self) -> Category:
        if self.kind == "keyboard":
            return Category.KEYBOARD
        if self.kind == "screen":
            return Category.SCREEN
        return Category.MOUSE_OP if (self.button_flags or 0) != 0 else Category.MOUSE_NOP
