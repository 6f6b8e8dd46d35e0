"""The event model shared by every stage: kinds, categories, decode statuses and one `Event`."""

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
