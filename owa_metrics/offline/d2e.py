"""The D2E protocol offline: a true and a predicted OWA MCAP recording -> upstream's binned keys (`functional.d2e`).

Each file's events move to video time (log time - offset, `events.d2e`); the pair's common range is binned; the
states are the sums of `owa_metrics.functional.d2e.STATES`, so pairs (files, ranks) add before `d2e_keys`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..events.d2e import D2ERecording, RecordingError, common_range_ns, read_d2e_recording
from ..functional.d2e import D2EEvents, bin_ns_of, d2e_keys, d2e_states, shift_rows


def pair_events(truth: D2ERecording, pred: D2ERecording) -> tuple[D2EEvents, D2EEvents]:
    """Both recordings' events in video time (one sequence each), each vk as its rank among the pair's distinct vks
    (any int64 vk, negative ones too, is its own key name, as upstream's ``{event_type}_{vk}``)."""
    vks = np.unique(np.concatenate([truth.vk, pred.vk]))
    return tuple(D2EEvents.of(r.key_ns - r.offset_ns, np.searchsorted(vks, r.vk), r.action, r.mouse_ns - r.offset_ns,
                              r.dx, r.dy, r.button_flags) for r in (truth, pred))


def pair_states(truth: D2ERecording, pred: D2ERecording, bin_ms: float = 50,
                bin_shifts: Sequence[int] = ()) -> torch.Tensor:
    """[len(shift_rows(bin_shifts)), len(STATES)] float64: the pair's sums over its common range; raises
    `RecordingError` naming the file with a move upstream cannot read there (`D2ERecording.check_moves`)."""
    bin_ns = bin_ns_of(bin_ms)
    start, end = common_range_ns(truth, pred)
    for recording in (truth, pred):
        recording.check_moves(start, end)
    return d2e_states(*pair_events(truth, pred), torch.tensor([start]), torch.tensor([end]), bin_ns,
                      shift_rows(bin_shifts), compiled=True)


def evaluate_d2e(pred_path: str | Path, target_path: str | Path, bin_ms: float = 50,
                 empty_bins_as_correct: bool = False, bin_shifts: Sequence[int] = ()) -> dict[str, float]:
    """Upstream's numbers for one pair (``evaluate.py target pred --bin-ms``), flattened to ``d2e/...`` keys (a
    none left out); ``bin_shifts``: the shift diagnostics too (`owa_metrics.functional.d2e.d2e_keys`)."""
    bin_ns_of(bin_ms)  # checked before any file is read
    states = pair_states(read_d2e_recording(target_path), read_d2e_recording(pred_path), bin_ms, bin_shifts)
    return d2e_keys(states, empty_bins_as_correct, shift_rows(bin_shifts))


def pair_folders(pred_dir: Path, target_dir: Path) -> list[tuple[str, Path, Path]]:
    """``(stem, pred file, target file)`` for each ``.mcap`` name in both folders, sorted by name; raises
    `RecordingError` naming a file that is in one folder only, or both folders when they share no file."""
    files = [{p.name: p for p in sorted(Path(d).glob("*.mcap")) if p.is_file()} for d in (pred_dir, target_dir)]
    for (mine, theirs), folder, other in ((files, pred_dir, target_dir), (files[::-1], target_dir, pred_dir)):
        alone = sorted(mine.keys() - theirs.keys())
        if alone and theirs.keys() & mine.keys():
            raise RecordingError(f"{mine[alone[0]]}: no file of that name in {other} (the folders pair their .mcap "
                                 f"files by name; {len(alone)} file(s) in {folder} only)")
    common = sorted(files[0].keys() & files[1].keys())
    if not common:
        raise RecordingError(f"{pred_dir} and {target_dir} have no .mcap file of the same name (the folders pair "
                             f"their files by name; {len(files[0])} and {len(files[1])} .mcap files)")
    return [(Path(name).stem, files[0][name], files[1][name]) for name in common]


def evaluate_d2e_folders(pred_dir: str | Path, target_dir: str | Path, bin_ms: float = 50,
                         empty_bins_as_correct: bool = False, bin_shifts: Sequence[int] = (),
                         progress: bool | None = None) -> dict[str, float]:
    """The D2E keys over the pairs of two folders (`pair_folders`): the pooled keys over every file's bins taken
    together (the states add), and each file's under ``tag/{stem}/d2e/...``. Under torch.distributed each rank reads
    the pairs it claims (the largest first: `streaming.Claims`) and the pairs' states are added in their order (call
    on every rank: every rank gets the same report). ``progress``: a bar of files and MB/s on stderr (None: when it is
    a terminal; rank 0)."""
    import sys

    from tqdm.auto import tqdm

    from .streaming import Claims, exchange, raise_first, rank_world

    bin_ns_of(bin_ms)  # checked before any file is read
    rank, _ = rank_world()
    pairs, error, states = None, None, {}
    try:
        pairs = pair_folders(Path(pred_dir), Path(target_dir))
    except RecordingError as err:
        error = err
    raise_first(error)
    sizes = [p.stat().st_size + t.stat().st_size for _, p, t in pairs]
    order = sorted(range(len(pairs)), key=lambda i: (-sizes[i], pairs[i][0]))  # the largest first
    show = (None if progress is None else progress) if rank == 0 else False
    with tqdm(total=sum(sizes), unit="B", unit_scale=True, file=sys.stderr, leave=False, disable=None if show is None
              else not show, desc=f"{len(pairs)} files") as bar:  # rank 0's: the bytes of the pairs claimed before
        at = 0
        try:
            for at in Claims(len(order)):
                stem, pred, target = pairs[order[at]]
                bar.set_description(f"file {at + 1}/{len(pairs)}")
                bar.update(sum(sizes[i] for i in order[:at]) - bar.n)
                states[stem] = pair_states(read_d2e_recording(target), read_d2e_recording(pred), bin_ms, bin_shifts)
        except Exception as err:  # noqa: BLE001 - every rank hears of it (none waits in a collective)
            error = err if isinstance(err, (RecordingError, ImportError)) else RecordingError(
                f"{pred} / {target}: cannot read the MCAP pair ({type(err).__name__}: {err})")
    raise_first(error, at)
    states = {stem: rows for part in exchange(states) for stem, rows in part.items()}
    shifts = shift_rows(bin_shifts)
    report = d2e_keys(sum(states[stem] for stem, _, _ in pairs), empty_bins_as_correct, shifts)
    for stem, _, _ in pairs:
        report.update(d2e_keys(states[stem], empty_bins_as_correct, shifts, prefix=f"tag/{stem}/d2e"))
    return report
