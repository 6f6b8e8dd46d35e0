"""The D2E protocol offline: a true and a predicted OWA MCAP recording -> upstream's binned keys (`functional.d2e`).

Each file's events move to video time (log time - offset, `events.d2e`); the pair's common range is binned; the
states are the sums of `owa_metrics.functional.d2e.STATES`, so pairs (files, ranks) add before `d2e_keys`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from .events.d2e import D2ERecording, common_range_ns, read_d2e_recording
from .functional.d2e import D2EEvents, bin_ns_of, d2e_keys, d2e_states, shift_rows


def recording_events(recording: D2ERecording, seq: int = 0) -> D2EEvents:
    """A recording's events in video time, as sequence ``seq``."""
    r, off = recording, recording.offset_ns
    key_seq, mouse_seq = (torch.full((len(x),), seq, dtype=torch.long) for x in (r.key_ns, r.mouse_ns))
    return D2EEvents.of(r.key_ns - off, r.vk, r.action, r.mouse_ns - off, r.dx, r.dy, r.button_flags, key_seq,
                        mouse_seq)


def pair_states(truth: D2ERecording, pred: D2ERecording, bin_ms: float = 50,
                bin_shifts: Sequence[int] = ()) -> torch.Tensor:
    """[len(shift_rows(bin_shifts)), len(STATES)] float64: the pair's sums over its common range."""
    start, end = common_range_ns(truth, pred)
    return d2e_states(recording_events(truth), recording_events(pred), torch.tensor([start]), torch.tensor([end]),
                      bin_ns_of(bin_ms), shift_rows(bin_shifts))


def evaluate_d2e(pred_path: str | Path, target_path: str | Path, bin_ms: float = 50,
                 empty_bins_as_correct: bool = False, bin_shifts: Sequence[int] = ()) -> dict[str, float]:
    """Upstream's numbers for one pair (``evaluate.py target pred --bin-ms``), flattened to ``d2e/...`` keys (a
    none left out); ``bin_shifts``: the shift diagnostics too (`owa_metrics.functional.d2e.d2e_keys`)."""
    states = pair_states(read_d2e_recording(target_path), read_d2e_recording(pred_path), bin_ms, bin_shifts)
    return d2e_keys(states, empty_bins_as_correct, shift_rows(bin_shifts))
