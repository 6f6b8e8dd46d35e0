"""A seeded desktop-session simulator: realistic event mixes without a recording.

Mouse paths with bell-shaped speed profiles and pauses, typing bursts of press/release pairs, clicks,
wheel scrolls, and screen frames at a fixed rate. Used by the demo, benchmarks and tests.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..schema import Event
from .recordings import fit_to_format

_MS = 1_000_000
_KEYS = [*range(65, 91), 32, 13, 8]  # letters, space, enter, backspace


ACTIVITY_MIX = {"move": 0.45, "type": 0.2, "click": 0.15, "scroll": 0.05, "pause": 0.15}


def simulate_session(duration_s: float = 60.0, seed: int = 0, screen_hz: float = 10.0, start_ns: int = 0,
                     format: Optional[str] = None, mix: Optional[dict[str, float]] = None) -> list[Event]:
    """Events of a ``duration_s`` desktop session, sorted by time (fitted to ``format``'s ranges when given).

    ``mix``: the weight of each activity (`ACTIVITY_MIX` keys, normalised), chosen one after another.
    """
    weights = {**ACTIVITY_MIX, **(mix or {})}
    if set(weights) != set(ACTIVITY_MIX) or min(weights.values()) < 0 or sum(weights.values()) <= 0:
        raise ValueError(f"mix must weigh the activities {sorted(ACTIVITY_MIX)} (>= 0, not all 0), got {mix}")
    p = np.array(list(weights.values())) / sum(weights.values())
    rng = np.random.default_rng(seed)
    end_ns = start_ns + int(duration_s * 1e9)
    events = [Event(kind="screen", timestamp_ns=int(t))
              for t in np.arange(start_ns, end_ns, int(1e9 / screen_hz))]
    t = start_ns
    while t < end_ns:
        activity = rng.choice(list(weights), p=p)
        if activity == "move":
            steps = int(rng.integers(10, 80))
            distance = rng.normal(0, 300, size=2)
            profile = np.sin(np.linspace(0, np.pi, steps)) ** 2  # bell-shaped speed
            deltas = np.round(np.outer(profile / profile.sum(), distance) + rng.normal(0, 0.7, (steps, 2))).astype(int)
            for dx, dy in deltas:
                t += int(rng.integers(4, 12)) * _MS
                events.append(Event(kind="mouse", timestamp_ns=t, dx=int(dx), dy=int(dy)))
        elif activity == "type":
            for vk in rng.choice(_KEYS, size=int(rng.integers(3, 13))):
                t += int(rng.integers(60, 250)) * _MS
                events.append(Event(kind="keyboard", timestamp_ns=t, vk=int(vk), action="press"))
                events.append(Event(kind="keyboard", timestamp_ns=t + int(rng.integers(30, 120)) * _MS,
                                    vk=int(vk), action="release"))
            t += 150 * _MS
        elif activity == "click":
            down, up = [(0x001, 0x002), (0x004, 0x008)][int(rng.random() < 0.15)]
            t += int(rng.integers(50, 200)) * _MS
            events.append(Event(kind="mouse", timestamp_ns=t, dx=0, dy=0, button_flags=down))
            t += int(rng.integers(60, 150)) * _MS
            events.append(Event(kind="mouse", timestamp_ns=t, dx=int(rng.integers(-2, 3)), dy=int(rng.integers(-2, 3)),
                                button_flags=up))
        elif activity == "scroll":
            direction = int(rng.choice([-1, 1]))
            for _ in range(int(rng.integers(1, 6))):
                t += int(rng.integers(30, 90)) * _MS
                events.append(Event(kind="mouse", timestamp_ns=t, dx=0, dy=0, button_flags=0x400,
                                    button_data=120 * direction))
        else:
            t += int(rng.integers(200, 2000)) * _MS
    events.sort(key=lambda e: e.timestamp_ns)
    return fit_to_format([e for e in events if e.timestamp_ns < end_ns], format)
