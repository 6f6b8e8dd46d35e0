"""The per-event values of the report, each declared once: the report's definitions (`report`) sample them, and the
functional twins (`events.percent_error`, `events.direction_error_deg`, ...) return them, through the same code
(`plan.evaluate` with torch ops; the compiled loop runs the same expressions on the CPU).

``value`` stands for any one number (the twins of a scalar error); ``dx`` / ``dy`` are a movement vector's.
"""

from __future__ import annotations

import torch

from .declare import (
    ONE, Value, direction_deg, error, ms, percent, pred, present, root_percent, same, same_where_present, true,
    wrapped_ns,
)
from .plan import evaluate

TIMESTAMP_ERROR_NS = wrapped_ns(error("timestamp_ns"))  # the shortest signed difference in the window
TIMESTAMP_ERROR_MS = ms(TIMESTAMP_ERROR_NS)
# |error| / the true timestamp within the window (>= 0): no absolute value needed
TIMESTAMP_PERCENT = percent(abs(TIMESTAMP_ERROR_NS), true("timestamp_ns"))
PERCENT = percent(abs(error("value")), abs(true("value")))
SIGNED_PERCENT = percent(error("value"), true("value"))
_EX, _EY, _GX, _GY = error("dx"), error("dy"), true("dx"), true("dy")
EUCLIDEAN_PERCENT = root_percent(_EX * _EX + _EY * _EY, _GX * _GX + _GY * _GY)  # ||error|| / ||true|| x 100
SIGNED_PERCENT_X, SIGNED_PERCENT_Y = percent(_EX, _GX), percent(_EY, _GY)
DIRECTION_DEG = direction_deg(pred("dx"), pred("dy"), _GX, _GY)
# the sums of the keyboard, button and movement keys (the report's states and the single metrics' twins)
KEYBOARD_BOTH = same("vk", "action")
KEYBOARD = {"vk_right": same("vk"), "action_right": same("action"), "both_right": KEYBOARD_BOTH, "events": ONE}
MOUSE_ACTION = {"flags_right": same_where_present("button_flags"), "with_flags": present("button_flags"),
                "scroll_right": same_where_present("button_data"), "with_scroll": present("button_data")}
MOVEMENT = {"residual": _EX * _EX + _EY * _EY, "gx": _GX, "gy": _GY, "gx2": _GX * _GX, "gy2": _GY * _GY, "events": ONE}


def of(value: Value, window_ns: int = 0, **leaves: torch.Tensor) -> torch.Tensor:
    """``value`` over rows, from its leaves given by name (``error_dx=``, ``true_dx=``, ... float64 [N])."""
    return over([value], window_ns, **leaves)[0]


def pair_leaves(preds: torch.Tensor, target: torch.Tensor, field: str) -> dict[str, torch.Tensor]:
    """``pred_{field}``, ``true_{field}``, ``error_{field}`` of two float64 tensors [N]."""
    return {f"pred_{field}": preds, f"true_{field}": target, f"error_{field}": preds - target}


def sums(named: dict[str, Value], **leaves: torch.Tensor) -> torch.Tensor:
    """[len(named)]: each value summed over every row (rows of one group: the single metrics' twins)."""
    return torch.stack([x.sum() for x in over(list(named.values()), **leaves)])


def over(values: list[Value], window_ns: int = 0, **leaves: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``values`` over rows, from their leaves given by name: shared nodes computed once."""
    return evaluate(values, torch.stack(list(leaves.values()), 1), list(leaves), window_ns)
