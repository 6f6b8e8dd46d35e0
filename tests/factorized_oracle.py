"""Independent oracle for the "factorized" token format, written from the format's specification only.

An event is ``<EVENT_START> TYPE T2 T1 T0 DATA <EVENT_END>`` with tokens back to back:

* timestamp: u = timestamp_ns // 10 ms; the three decimal digits of u mod 1000, most significant first;
* KEYBOARD: ``<VK_{vk}>`` then ``<press>`` | ``<release>`` (vk must be 0..255);
* MOUSE: dx then dy, each clamped to [-1999, 1999] and written as a sign token (``<SIGN_PLUS>`` for >= 0)
  and the 4 digits of |value| over bases [2, 10, 10, 10]; then button_flags (0..0xFFF) as three
  ``<MB_h>`` hex digits, most significant first; then, only when button_data != 0,
  s = signed16(button_data) // 120 (which must lie in [-9, 9]) as a sign token and the digit ``<|s|>``;
* SCREEN: ``<fake_image_placeholder>`` as the data (text form).

Nothing here is imported from the package except the public ``Event`` dataclass.
"""

from owa_metrics import Event

UNIT_NS = 10_000_000
WINDOW_UNITS = 1000
DELTA_LIMIT = 1999
DELTA_BASES = (2, 10, 10, 10)
SCROLL_UNIT = 120
SCROLL_LIMIT = 9

FACTORIZED_VOCAB = tuple(
    ["<EVENT_START>", "<EVENT_END>", "<KEYBOARD>", "<MOUSE>", "<SCREEN>", "<press>", "<release>",
     "<SIGN_PLUS>", "<SIGN_MINUS>"]
    + [f"<{d}>" for d in range(10)]
    + [f"<VK_{vk}>" for vk in range(256)]
    + [f"<MB_{h}>" for h in range(16)]
)
assert len(FACTORIZED_VOCAB) == len(set(FACTORIZED_VOCAB)) == 291

IMAGE_PLACEHOLDER = "<fake_image_placeholder>"


def signed16(value: int) -> int:
    """0..65535 -> -32768..32767 (two's complement); values already in -32768..32767 are unchanged."""
    return (value + 32768) % 65536 - 32768


def clamp_delta(value: int) -> int:
    return min(max(value, -DELTA_LIMIT), DELTA_LIMIT)


def scroll_steps(button_data: int) -> int:
    """signed16(button_data) // 120 with Python floor division."""
    return signed16(button_data) // SCROLL_UNIT


def _timestamp_tokens(timestamp_ns: int) -> list:
    u = (timestamp_ns // UNIT_NS) % WINDOW_UNITS
    return [f"<{u // 100}>", f"<{u // 10 % 10}>", f"<{u % 10}>"]


def _sign(value: int) -> str:
    return "<SIGN_PLUS>" if value >= 0 else "<SIGN_MINUS>"


def _delta_tokens(value: int) -> list:
    v = clamp_delta(value)
    mag = abs(v)
    digits = []
    for base in reversed(DELTA_BASES):  # least significant first, then reversed
        digits.append(mag % base)
        mag //= base
    assert mag == 0
    return [_sign(v)] + [f"<{d}>" for d in reversed(digits)]


def encode_factorized_tokens(event: Event) -> list:
    """The token list of one event (text form: a screen event's image is the placeholder token)."""
    ts = _timestamp_tokens(event.timestamp_ns)
    if event.kind == "keyboard":
        if not 0 <= event.vk <= 255:
            raise ValueError(f"vk {event.vk} has no token (0..255)")
        if event.action not in ("press", "release"):
            raise ValueError(f"bad keyboard action {event.action!r}")
        data = [f"<VK_{event.vk}>", f"<{event.action}>"]
        kind = "<KEYBOARD>"
    elif event.kind == "mouse":
        flags = event.button_flags or 0
        if not 0 <= flags <= 0xFFF:
            raise ValueError(f"button_flags {flags:#x} outside 0..0xFFF")
        data = _delta_tokens(event.dx) + _delta_tokens(event.dy)
        data += [f"<MB_{flags >> 8 & 0xF}>", f"<MB_{flags >> 4 & 0xF}>", f"<MB_{flags & 0xF}>"]
        if event.button_data:
            s = scroll_steps(event.button_data)
            if not -SCROLL_LIMIT <= s <= SCROLL_LIMIT:
                raise ValueError(f"scroll of {s} steps outside [-9, 9]")
            data += [_sign(s), f"<{abs(s)}>"]
        kind = "<MOUSE>"
    elif event.kind == "screen":
        data = [IMAGE_PLACEHOLDER]
        kind = "<SCREEN>"
    else:
        raise ValueError(f"unknown kind {event.kind!r}")
    return ["<EVENT_START>", kind] + ts + data + ["<EVENT_END>"]


def encode_factorized(event: Event) -> str:
    return "".join(encode_factorized_tokens(event))


def normalized_factorized(event: Event) -> Event:
    """What decode(encode(event)) must give in the factorized format."""
    ts = (event.timestamp_ns // UNIT_NS) % WINDOW_UNITS * UNIT_NS
    if event.kind == "keyboard":
        return Event(kind="keyboard", timestamp_ns=ts, vk=event.vk, action=event.action)
    if event.kind == "screen":
        return Event(kind="screen", timestamp_ns=ts)
    bd = scroll_steps(event.button_data) * SCROLL_UNIT if event.button_data else 0
    return Event(kind="mouse", timestamp_ns=ts, dx=clamp_delta(event.dx), dy=clamp_delta(event.dy),
                 button_flags=event.button_flags or 0, button_data=bd)
