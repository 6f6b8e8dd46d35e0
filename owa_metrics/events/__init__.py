"""Events: the decoded form every metric works on."""

from .event import CATEGORY_NAMES, Category, Event, Kind, Status

__all__ = ["CATEGORY_NAMES", "Category", "Event", "Kind", "Status"]
