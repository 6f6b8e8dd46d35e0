"""Decode: token-id tensors -> a batch of events (vectorized), and the per-event reference path."""

from .batch import IGNORE_INDEX, align_teacher_forcing, decode_batch
from .event_batch import EventBatch, EventFields, TimeMatching
from .matching import greedy_match, match_by_time, unwrap_ns
from .reference import reference_decode

__all__ = ["IGNORE_INDEX", "EventBatch", "EventFields", "align_teacher_forcing", "decode_batch", "reference_decode",
           "TimeMatching", "greedy_match", "match_by_time", "unwrap_ns"]
