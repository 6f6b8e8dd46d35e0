"""Events: real recordings and the simulator, as `Event` lists (the `Event` and its codes live in `owa_metrics.schema`,
re-exported here)."""

from ..schema import CATEGORY_NAMES, Category, Event, Kind, Status
from .recordings import read_recording
from .simulate import simulate_session

__all__ = ["CATEGORY_NAMES", "Category", "Event", "Kind", "Status", "read_recording", "simulate_session"]
