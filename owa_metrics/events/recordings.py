"""Real OWA desktop recordings (MCAP) -> event streams in the token format's terms.

Recorded mouse events are absolute (x, y); the token format holds raw relative ones: dx / dy are the
differences of consecutive positions (starting from the recorder's ``mouse/state``), and a click becomes
the raw button flag of its button and direction. Screen frames keep only their timestamp.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

from ..schema import Event

# RawMouseEvent.ButtonFlags of owa-msgs: (down, up) per button, and the wheels
_BUTTON_FLAGS = {"left": (0x001, 0x002), "right": (0x004, 0x008), "middle": (0x010, 0x020),
                 "x1": (0x040, 0x080), "x2": (0x100, 0x200)}
_WHEEL, _HWHEEL = 0x400, 0x800
_TOPICS = ["keyboard", "mouse", "screen", "mouse/state"]


def read_recording(path: str | Path, format: Optional[str] = None) -> list[Event]:
    """Every keyboard, mouse and screen event of an OWA MCAP file, in time order; with ``format``
    (``"hierarchical"`` | ``"factorized"``) mouse deltas and wheel steps are clamped into that format's range."""
    try:
        from mcap_owa.highlevel import OWAMcapReader
    except ImportError as err:  # pragma: no cover - depends on the optional extra
        raise ImportError("reading OWA recordings needs the 'owa' extra: pip install 'owa-metrics[owa]'") from err
    events: list[Event] = []
    x = y = None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Reader version")
        with OWAMcapReader(str(path)) as reader:
            for msg in reader.iter_messages(topics=_TOPICS):
                if msg.topic == "screen":  # only the time matters; old screen schemas do not decode any more
                    events.append(Event(kind="screen", timestamp_ns=msg.timestamp))
                    continue
                d = msg.decoded
                if msg.topic == "mouse/state":
                    x, y = d.x, d.y
                elif msg.topic == "keyboard":
                    events.append(Event(kind="keyboard", timestamp_ns=msg.timestamp, vk=d.vk, action=d.event_type))
                else:
                    dx, dy = (0, 0) if x is None else (d.x - x, d.y - y)
                    x, y = d.x, d.y
                    flags, data = 0, 0
                    if d.event_type == "click":
                        flags = _BUTTON_FLAGS[d.button][0 if d.pressed else 1]
                    elif d.event_type == "scroll":
                        vertical = bool(d.dy)
                        flags, data = (_WHEEL, d.dy * 120) if vertical else (_HWHEEL, (d.dx or 0) * 120)
                    events.append(Event(kind="mouse", timestamp_ns=msg.timestamp, dx=dx, dy=dy,
                                        button_flags=flags, button_data=data))
    return fit_to_format(events, format)


def fit_to_format(events: list[Event], format: Optional[str]) -> list[Event]:
    """``events`` as the format can write them (`EventCodec.fit`); unchanged when ``format`` is None."""
    if format is None:
        return events
    from ..tokens.codec import CodecConfig, EventCodec

    codec = EventCodec(CodecConfig.preset(format))
    return [codec.fit(e) for e in events]
