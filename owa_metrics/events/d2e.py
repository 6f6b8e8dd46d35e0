"""An OWA MCAP recording as the D2E protocol reads it: the first screen's clock, keyboard and raw mouse events.

Upstream's ``evaluate.py`` (worv-ai/D2E) moves each file's clock to video time: offset = the first ``screen``
message's log time minus its ``media_ref.pts_ns``; the file covers [pts, pts + (end_time - that log time)] there,
``end_time`` being the file's last message log time (the summary's). `common_range_ns` is the pair's overlap.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_ACTIONS = {"press": 0, "release": 1}


class RecordingError(ValueError):
    """A recording the D2E protocol cannot read (no screen, no overlap); the message names the file(s)."""


class NoRawMouseWarning(UserWarning):
    """A recording with absolute ``mouse`` messages and no ``mouse/raw`` ones, which the D2E protocol reads."""


@dataclass
class D2ERecording:
    """One file: its first screen's log time and ``pts_ns``, its end time (ns), and int64 arrays of the keyboard
    events (log time, vk, action: 0 press, 1 release), the ``mouse/raw`` events (log time, dx, dy, button_flags) and
    the log times and ``us_flags`` of its moves that upstream cannot read (`read_d2e_recording`)."""

    path: str
    first_screen_ns: int
    first_pts_ns: int
    end_ns: int
    key_ns: np.ndarray
    vk: np.ndarray
    action: np.ndarray
    mouse_ns: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    button_flags: np.ndarray
    unread_ns: np.ndarray
    unread_us_flags: np.ndarray

    @property
    def offset_ns(self) -> int:
        """Log time - video time."""
        return self.first_screen_ns - self.first_pts_ns

    @property
    def video_range_ns(self) -> tuple[int, int]:
        return self.first_pts_ns, self.first_pts_ns + (self.end_ns - self.first_screen_ns)

    def check_moves(self, start_ns: int, end_ns: int) -> None:
        """Raise `RecordingError` naming the file when a move it holds with a non-zero ``us_flags`` lies in the
        video-time range [start_ns, end_ns): upstream reads dx / dy only where ``us_flags`` is 0 (relative)."""
        at = self.unread_ns - self.offset_ns
        inside = np.flatnonzero((at >= start_ns) & (at < end_ns))
        if len(inside):
            i = inside[0]
            raise RecordingError(
                f"{self.path}: {len(inside)} mouse/raw move(s) (button_flags 0) in the compared range with us_flags "
                f"other than 0 (MOUSE_MOVE_RELATIVE), the first at log time {self.unread_ns[i]} with us_flags "
                f"{self.unread_us_flags[i]:#x}: the D2E protocol reads dx / dy of relative moves only")


def read_d2e_recording(path: str | Path) -> D2ERecording:
    """The first screen (the earliest by log time), keyboard and ``mouse/raw`` of an OWA MCAP file (log times, as
    written). A ``mouse/raw`` move (``button_flags`` 0) with a non-zero ``us_flags`` is kept aside (upstream
    cannot read its dx / dy: `D2ERecording.check_moves`); a click or wheel with one counts. Raises
    `RecordingError` naming the file when it does not exist, is not a readable MCAP file, or has no screen message
    with ``media_ref.pts_ns`` first; warns (`NoRawMouseWarning`) when it has absolute ``mouse`` messages but no
    ``mouse/raw`` (its mouse keys would count nothing, silently). One pass of the ``mcap`` package's reader in the
    file's order, without its log-time sort (binning adds, in any order); each keyboard / ``mouse/raw`` message's
    JSON read by ``json.loads`` (the pydantic models are not built: ~10x the reading), the screens' only for the
    first one."""
    import json
    from array import array

    try:
        from mcap.reader import make_reader
    except ImportError as err:  # pragma: no cover - depends on the optional extra
        raise ImportError("reading OWA recordings needs the 'owa' extra: pip install 'owa-metrics[owa]'") from err
    if not Path(path).exists():
        raise RecordingError(f"{path}: does not exist")
    keys, mice, unread, screen = array("q"), array("q"), array("q"), None
    loads = json.loads
    try:
        with open(path, "rb") as f:
            reader = make_reader(f)
            summary = reader.get_summary()
            stats = None if summary is None else summary.statistics
            end_ns = None if stats is None else stats.message_end_time
            counted = None if stats is None else {summary.channels[c].topic: n for c, n in
                                                  stats.channel_message_counts.items() if c in summary.channels}
            last_ns, absolute = None, 0  # absolute: the `mouse` messages, counted here without a summary
            for _, channel, message in reader.iter_messages(
                    topics=["screen", "keyboard", "mouse/raw"] + (["mouse"] if counted is None else []),
                    log_time_order=False):
                topic, t = channel.topic, message.log_time
                if topic == "mouse":
                    absolute += 1
                    continue
                last_ns = t if last_ns is None else max(last_ns, t)
                if channel.message_encoding != "json":
                    raise RecordingError(f"{path}: {topic} messages in {channel.message_encoding!r}, not OWA's json")
                if topic == "mouse/raw":
                    d = loads(message.data)
                    flags = d.get("button_flags", 0)
                    if d.get("us_flags", 0) and flags == 0:
                        unread.extend((t, d["us_flags"]))
                    else:
                        mice.extend((t, d["last_x"], d["last_y"], flags))
                elif topic == "keyboard":
                    d = loads(message.data)
                    keys.extend((t, d["vk"], _ACTIONS[d["event_type"]]))
                elif screen is None or t < screen[0]:
                    screen = (t, message.data)
    except RecordingError:
        raise
    except Exception as err:  # noqa: BLE001 - truncated, not MCAP, a message that is not OWA's: name the file
        raise RecordingError(f"{path}: not a readable OWA MCAP recording ({type(err).__name__}: {err})") from err
    if screen is None:
        raise RecordingError(f"{path}: no screen message: the D2E protocol aligns each file's clock on its "
                             "first screen's media_ref.pts_ns")
    try:
        screen = (screen[0], int(loads(screen[1])["media_ref"]["pts_ns"]))
    except (KeyError, TypeError, ValueError) as err:
        raise RecordingError(f"{path}: its first screen message has no media_ref.pts_ns ({type(err).__name__}), "
                             "which the D2E protocol aligns the clocks on") from err
    k = np.frombuffer(keys, dtype=np.int64).reshape(-1, 3)
    m = np.frombuffer(mice, dtype=np.int64).reshape(-1, 4)
    u = np.frombuffer(unread, dtype=np.int64).reshape(-1, 2)
    absolute = absolute if counted is None else counted.get("mouse", 0)
    if not len(m) and not len(u) and absolute:
        warnings.warn(NoRawMouseWarning(
            f"{path}: no mouse/raw messages, the topic the D2E protocol reads the mouse from (relative moves and "
            f"button flags); its {absolute} absolute mouse messages are not read, so its mouse_move and "
            "mouse_button keys count no event of this file"), stacklevel=2)
    return D2ERecording(str(path), int(screen[0]), screen[1], int(end_ns if end_ns is not None else last_ns), k[:, 0],
                        k[:, 1], k[:, 2], m[:, 0], m[:, 1], m[:, 2], m[:, 3], u[:, 0], u[:, 1])


def common_range_ns(truth: D2ERecording, pred: D2ERecording) -> tuple[int, int]:
    """[max of the first-screen pts, min of the files' video ends]; raises `RecordingError` naming both files when
    they do not overlap."""
    (t0, t1), (p0, p1) = truth.video_range_ns, pred.video_range_ns
    start, end = max(t0, p0), min(t1, p1)
    if end <= start:
        raise RecordingError(f"{pred.path} and {truth.path} do not overlap in video time (first screen's pts_ns to "
                             f"its end): [{p0}, {p1}] vs [{t0}, {t1}] ns")
    return start, end
