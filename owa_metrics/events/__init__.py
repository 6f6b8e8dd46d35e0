"""Events: the decoded form every metric works on, from real recordings or the simulator."""

from .event import CATEGORY_NAMES, Category, Event, Kind, Status
from .recordings import read_recording
from .simulate import simulate_session

__all__ = ["CATEGORY_NAMES", "Category", "Event", "Kind", "Status", "read_recording", "simulate_session"]
