"""A timeline of one sequence: its true events above, the predicted ones below, on one axis in seconds from the
sequence's origin.

Lanes, top to bottom: one per key seen on either side (named: ``W``, ``Space``, ``LShift``; a bar from each press
to the key's next event on that side, its release or a repeat, so the bars are the presses), one per mouse button
(a bar from each down to the button's next event), the wheel (a tick per notch event, pointing its direction),
moves, screens (faint ticks). In each lane the true events sit in the upper half, the predicted ones in the lower.
Below, the cursor path: cumulative dx and dy of each side's mouse events. What the pairing found joins them: each
comparable pair a link (green: same key / button / detail, or with time pairing a detection match; orange: same
kind only), each miss (a true event paired with nothing) and false alarm (a valid predicted event paired with
nothing) a marker of its own colour, each true event whose prediction does not decode or is of another kind a
cross. With ``bin_ms`` a band of the D2E bins: green where every key (button) name's count in the bin agrees, red
where one does not, blank where neither side has one.

Drawing is for inspection (a few sequences an epoch): short loops over lanes, never over a batch in ``update``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from ..decode.event_batch import EventBatch
from ..functional.d2e import BUTTONS, batch_events, bin_ns_of
from ..report import HWHEEL, KEY_NAMES, WHEEL
from ..schema import Category, Status

# RAWMOUSE usButtonFlags: each button's lane, down bit, up bit
BUTTON_LANES = (("left", 0x001, 0x002), ("right", 0x004, 0x008), ("middle", 0x010, 0x020), ("x1", 0x040, 0x080),
                ("x2", 0x100, 0x200))
TRUE_COLOR, PRED_COLOR = "#1f4e9c", "#d9730d"
EXACT_COLOR, KIND_COLOR, MISS_COLOR, FALSE_ALARM_COLOR, UNCOMPARABLE_COLOR = \
    "#2ca02c", "#ff9f1c", "#d62728", "#9467bd", "#7f7f7f"
AGREE_COLOR, DIFFER_COLOR = "#8fd18f", "#f08a8a"
NOT_COMPARABLE = (Status.INVALID_FORMAT, Status.MISSING_FIELDS, Status.TRUNCATED, Status.TYPE_MISMATCH)
_COLUMNS = ("time_ns", "category", "vk", "action", "dx", "dy", "button_flags", "button_data")


@dataclass
class Track:
    """One side's events of a sequence, [n] numpy arrays: time in ns from the sequence's origin, `Category`, vk,
    action (0 press, 1 release), dx, dy, button_flags, button_data; ``valid``: the event decodes and has a time (one
    that does not keeps its index and is drawn nowhere)."""

    time_ns: np.ndarray
    category: np.ndarray
    vk: np.ndarray
    action: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    button_flags: np.ndarray
    button_data: np.ndarray
    valid: np.ndarray

    def __len__(self) -> int:
        return len(self.time_ns)

    def lanes(self) -> np.ndarray:
        """Each event's lane name (`lane_of`)."""
        return np.array([lane_of(int(c), int(v), int(f)) for c, v, f in
                         zip(self.category, self.vk, self.button_flags)], dtype=object)

    def where(self, mask: np.ndarray) -> np.ndarray:
        return np.flatnonzero(self.valid & mask)


def lane_of(category: int, vk: int, button_flags: int) -> str:
    """An event's lane: ``key:{vk}``, ``button:{name}`` (its first button bit), ``wheel``, ``hwheel``, ``move``
    (a mouse event without buttons, or with flags of no lane), ``screen``."""
    if category == Category.KEYBOARD:
        return f"key:{vk}"
    if category == Category.SCREEN:
        return "screen"
    for name, down, up in BUTTON_LANES:
        if button_flags & (down | up):
            return f"button:{name}"
    if button_flags & WHEEL:
        return "wheel"
    if button_flags & HWHEEL:
        return "hwheel"
    return "move"


@dataclass
class Bins:
    """The D2E bins of one sequence (`owa_metrics.functional.d2e`, shift 0): ``num_bins`` of ``bin_ns`` from
    ``start_ns``; per bin the (bin, name) pairs whose true and predicted counts agree (``*_right``) of those seen on
    either side (``*_values``), for key names (vk, action) and button names."""

    bin_ns: int
    start_ns: int
    num_bins: int
    key_right: np.ndarray
    key_values: np.ndarray
    button_right: np.ndarray
    button_values: np.ndarray

    def state(self, kind: str) -> np.ndarray:
        """Per bin: -1 no name on either side, 1 every name's counts agree, 0 one does not."""
        right, values = getattr(self, f"{kind}_right"), getattr(self, f"{kind}_values")
        return np.where(values == 0, -1, (right == values).astype(int))


@dataclass
class Timeline:
    """One sequence's two `Track` s and what the pairing found (indices into the tracks): ``links`` [n, 2] (true,
    predicted) the comparable pairs, ``exact`` [n] which of them agree in detail (time pairing: the detection
    matches), ``misses`` true events paired with nothing, ``false_alarms`` valid predicted events paired with
    nothing, ``not_comparable`` true events whose prediction does not decode or is of another kind;
    ``undecoded_pred``: predicted events (generation) that do not decode (no time: not drawn). ``end_ns`` the
    sequence's end on its axis; ``bins`` the D2E bins (with ``bin_ms``)."""

    true: Track
    pred: Track
    title: str
    pairing: str  # "index", "time" or "none" (two recordings, not paired)
    end_ns: int
    links: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    exact: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    misses: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    false_alarms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    not_comparable: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    undecoded_pred: int = 0
    bins: Optional[Bins] = None


# ------------------------------------------------------------------------------------------------- building
def _track(fields, ns: np.ndarray, rows: np.ndarray, valid: np.ndarray, origin: int) -> Track:
    values = fields.values.cpu().numpy()[rows]
    return Track(ns[rows] - origin, values[:, 0], *(values[:, i] for i in range(2, 8)), valid[rows])  # (no timestamp)


def batch_timelines(batch: EventBatch, window_ns: int, sequences: Sequence[int], bin_ms: Optional[float] = None,
                    tags: Optional[Sequence[Optional[str]]] = None, names: Optional[Sequence[str]] = None,
                    context: Optional[EventBatch] = None) -> list[Timeline]:
    """The `Timeline` of each of ``sequences`` (rows of ``batch``) of a decoded batch (`decode_batch`): both sides'
    times as the D2E protocol reads them (`batch_events`: with time pairing the matching's axis, else unwrapped from
    the row's first valid true event), in seconds from the row's origin (time pairing) or first valid true event.
    ``tags`` each row's tag and ``names`` each row's name for the title (default ``sequence {row}``). ``context``:
    the same rows' true ids decoded with their screens (in generation the metric scores ``batch`` without them,
    screens being context): those screens join the true track (after its events: the indices stay), unwrapped on
    the row's axis."""
    truth, pred, start, end = batch_events(batch, window_ns)
    screens = None if context is None else _context_screens(context, start, window_ns)
    t_ns, p_ns, start, end = (x.cpu().numpy() for x in (truth.ns, pred.ns, start, end))
    seq, status = batch.seq_idx.cpu().numpy(), batch.status.cpu().numpy()
    t_ok = batch.target.status.cpu().numpy() == Status.VALID
    tm, generation = batch.time_matching, batch.generated is not None
    p_fields = batch.generated if generation else batch.pred
    p_seq = batch.generated_seq.cpu().numpy() if generation else seq
    p_ok = p_fields.status.cpu().numpy() == Status.VALID
    if not generation:
        p_ok &= t_ok
    paired = tm.paired.cpu().numpy() if tm is not None else None
    detected = tm.detection.cpu().numpy() if tm is not None else None
    out = []
    for b in sequences:
        rows, p_rows = np.flatnonzero(seq == b), np.flatnonzero(p_seq == b)
        true, predicted = _track(batch.target, t_ns, rows, t_ok, start[b]), _track(p_fields, p_ns, p_rows, p_ok, start[b])
        if screens is not None:
            true = _with_screens(true, screens[1][screens[0] == b] - start[b])
        st = status[rows]
        ok = st == Status.VALID
        local = np.arange(len(rows))
        if tm is not None:
            pair = paired[rows] - (p_rows[0] if len(p_rows) else 0)
            links = np.stack([local[ok], pair[ok]], 1)
            exact = detected[rows][ok] >= 0
            linked = np.zeros(len(p_rows), dtype=bool)
            linked[pair[ok]] = True
            false_alarms = np.flatnonzero(predicted.valid & ~linked)
        else:
            links = np.stack([local[ok], local[ok]], 1)  # the k-th events of both sides
            true_lanes, pred_lanes = true.lanes(), predicted.lanes()
            exact = true_lanes[links[:, 0]] == pred_lanes[links[:, 1]] if len(links) else np.zeros(0, dtype=bool)
            false_alarms = np.flatnonzero(predicted.valid & (np.arange(len(p_rows)) >= len(rows))) if generation \
                else np.zeros(0, dtype=np.int64)
        timeline = Timeline(true, predicted, "", "time" if tm is not None else "index", int(end[b] - start[b]),
                            links.astype(np.int64), np.asarray(exact, dtype=bool),
                            np.flatnonzero(st == Status.MISSING), false_alarms.astype(np.int64),
                            np.flatnonzero(np.isin(st, NOT_COMPARABLE)),
                            int((~p_ok[p_rows]).sum()) if generation else 0)
        if bin_ms is not None:
            timeline.bins = d2e_bins(true, predicted, 0, timeline.end_ns, bin_ns_of(bin_ms))
        name = names[b] if names is not None else f"sequence {b}"
        tag = tags[b] if tags is not None else None
        timeline.title = f"{tag}: {name}" if tag is not None else name
        timeline.title += ": " + score_words(timeline, int((st != Status.INVALID_TARGET).sum()),
                                             int(t_ok[rows].sum()), len(p_rows))
        out.append(timeline)
    return out


def _context_screens(context: EventBatch, start: torch.Tensor, window_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, absolute time) of each valid screen among ``context``'s true events, unwrapped from ``start`` (each row's
    first valid true event of the scored batch, or its time origin: `batch_events`' axis)."""
    from ..decode.matching import unwrap_ns

    t = context.target
    valid = t.status == int(Status.VALID)
    ns = unwrap_ns(context.seq_idx, t.timestamp_ns, valid, start.to(t.timestamp_ns.device), window_ns)
    screen = (valid & (t.category == int(Category.SCREEN))).cpu().numpy()
    return context.seq_idx.cpu().numpy()[screen], ns.cpu().numpy()[screen]


def _with_screens(track: Track, time_ns: np.ndarray) -> Track:
    """``track`` followed by screens at ``time_ns``."""
    n, zero = len(time_ns), np.zeros(len(time_ns), dtype=np.int64)
    return Track(np.concatenate([track.time_ns, time_ns]),
                 np.concatenate([track.category, np.full(n, int(Category.SCREEN))]),
                 *(np.concatenate([getattr(track, c), zero]) for c in _COLUMNS[2:]),
                 np.concatenate([track.valid, np.ones(n, dtype=bool)]))


def score_words(timeline: Timeline, decoded_targets: int, valid_targets: int, pred_events: int) -> str:
    """The sequence's own comparable rate (comparable / true events that decode), or with time pairing its
    detection F1 = 2 TP / (2 TP + FP + FN): TP the detection matches, FN the valid true events without one, FP the
    predicted events without one (those that do not decode too)."""
    if timeline.pairing == "time":
        tp = int(timeline.exact.sum())
        fn, fp = valid_targets - tp, pred_events - tp
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
        return (f"detection F1 {f1:.2f} ({tp} matched, {len(timeline.misses)} missed, "
                f"{len(timeline.false_alarms)} false alarms)")
    rate = len(timeline.links) / decoded_targets if decoded_targets else float("nan")
    return f"comparable {rate:.0%} ({len(timeline.links)} of {decoded_targets} true events)"


def d2e_bins(true: Track, pred: Track, start_ns: int, end_ns: int, bin_ns: int) -> Bins:
    """The bins of [start_ns, end_ns) (the last one shorter) and each bin's agreeing names, as the D2E protocol
    counts them: a key name is (vk, action) of a keyboard event, a button name one of `BUTTONS`' bits of a mouse
    event; an event before start or at / after end counts nowhere."""
    n = max(-(-(end_ns - start_ns) // bin_ns), 0)
    names = 1 << 21

    def keyed(track: Track, kind: str) -> np.ndarray:
        inside = track.valid & (track.time_ns >= start_ns) & (track.time_ns < end_ns)
        bins = (track.time_ns - start_ns) // bin_ns
        if kind == "key":
            pick = inside & (track.category == Category.KEYBOARD)
            return bins[pick] * names + track.vk[pick] * 2 + track.action[pick]
        mouse = inside & np.isin(track.category, (Category.MOUSE_OP, Category.MOUSE_NOP))
        return np.concatenate([bins[mouse & ((track.button_flags & bit) > 0)] * names + i
                               for i, (_, bit) in enumerate(BUTTONS)])

    counts = {}
    for kind in ("key", "button"):
        (kt, ct), (kp, cp) = (np.unique(keyed(side, kind), return_counts=True) for side in (true, pred))
        keys = np.union1d(kt, kp)
        a, b = np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=np.int64)
        a[np.searchsorted(keys, kt)], b[np.searchsorted(keys, kp)] = ct, cp
        at = (keys // names).astype(np.int64)
        counts[f"{kind}_right"] = np.bincount(at, weights=a == b, minlength=n).astype(np.int64)
        counts[f"{kind}_values"] = np.bincount(at, minlength=n).astype(np.int64)
    return Bins(bin_ns, start_ns, n, **counts)


def recording_timeline(truth, pred, title: str, bin_ms: Optional[float] = None) -> Timeline:
    """Two D2E recordings (`owa_metrics.events.d2e.D2ERecording`) of one file name, in video time from the start of
    their common range (`common_range_ns`): keyboard and mouse events, not paired (``pairing="none"``); with
    ``bin_ms`` the protocol's bins."""
    from ..events.d2e import common_range_ns

    start, end = common_range_ns(truth, pred)
    tracks = [_recording_track(r, start + r.offset_ns) for r in (truth, pred)]
    timeline = Timeline(*tracks, title, "none", end - start)
    if bin_ms is not None:
        timeline.bins = d2e_bins(*tracks, 0, end - start, bin_ns_of(bin_ms))
    return timeline


def _recording_track(r, origin_ns: int) -> Track:
    """A recording's keyboard and mouse events in time order, times from ``origin_ns`` (log time)."""
    k, m = len(r.key_ns), len(r.mouse_ns)
    zk, zm = np.zeros(k, dtype=np.int64), np.zeros(m, dtype=np.int64)
    columns = [np.concatenate(pair) for pair in (
        (r.key_ns - origin_ns, r.mouse_ns - origin_ns),
        (np.full(k, int(Category.KEYBOARD)), np.where(r.button_flags != 0, int(Category.MOUSE_OP),
                                                        int(Category.MOUSE_NOP))),
        (r.vk, zm), (r.action, zm), (zk, r.dx), (zk, r.dy), (zk, r.button_flags), (zk, zm))]
    order = np.argsort(columns[0], kind="stable")
    return Track(*(c[order].astype(np.int64) for c in columns), np.ones(k + m, dtype=bool))


def sequence_errors(batch: EventBatch) -> torch.Tensor:
    """[num_sequences] each sequence's errors: its true events that decode but have no comparable prediction
    (missing, another kind, not decoding), plus in generation its predicted events paired with no true one (index:
    beyond the true events; time: unmatched). Vectorized (the offline report ranks every sequence by it)."""
    B, seq = batch.num_sequences, batch.seq_idx.long()
    wrong = (batch.status != int(Status.VALID)) & (batch.status != int(Status.INVALID_TARGET))
    errors = torch.zeros(B, dtype=torch.long, device=seq.device).index_add_(0, seq, wrong.long())
    if batch.generated is not None:
        present = (batch.status != int(Status.MISSING)) & (batch.status != int(Status.INVALID_TARGET))
        answered = torch.zeros(B, dtype=torch.long, device=seq.device).index_add_(0, seq, present.long())
        errors += (batch.pred_count.long() - answered).clamp(min=0)
    return errors


# -------------------------------------------------------------------------------------------------- drawing
def _lane_order(lanes: set) -> list[str]:
    rank = {"wheel": 2, "hwheel": 3, "move": 4, "screen": 5}
    buttons = [f"button:{name}" for name, _, _ in BUTTON_LANES]

    def key(lane):
        if lane.startswith("key:"):
            return (0, int(lane[4:]))
        if lane in buttons:
            return (1, buttons.index(lane))
        return (rank[lane], 0)

    return sorted(lanes, key=key)


def lane_label(lane: str) -> str:
    if lane.startswith("key:"):
        vk = int(lane[4:])
        return KEY_NAMES.get(vk, f"vk {vk}")
    return lane.split(":")[-1] + (" button" if lane.startswith("button:") else "")


def _bars(track: Track, lanes: np.ndarray, lane: str, end_ns: int, start_mask: np.ndarray, stop_mask: np.ndarray):
    """(start, length) in s of a bar from each event of ``lane`` with ``start_mask`` (a press, a down) to the lane's
    next event on that side, the axis end when none; and the times of leading stops (a release before any press)."""
    at = np.flatnonzero(track.valid & (lanes == lane))
    at = at[np.argsort(track.time_ns[at], kind="stable")]
    t = track.time_ns[at]
    ends = np.append(t[1:], max(end_ns, t[-1] if len(t) else end_ns))
    starts = start_mask[at]
    first = np.argmax(starts) if starts.any() else len(at)
    lead = t[:first][stop_mask[at][:first]]
    return [(s / 1e9, (e - s) / 1e9) for s, e in zip(t[starts], ends[starts])], lead / 1e9


def draw_timeline(timeline: Timeline, width_in: float = 10.0, dpi: int = 100):
    """The figure of a `Timeline` (see the module); every element's ``gid`` says what it is (``key_bars:true``,
    ``links:exact``, ``misses``, ``bins:key:agree``, ...) and its count what it drew."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tl = timeline
    true_lanes, pred_lanes = tl.true.lanes(), tl.pred.lanes()
    order = _lane_order({*true_lanes[tl.true.valid], *pred_lanes[tl.pred.valid]}) or ["move"]
    row = {lane: -i for i, lane in enumerate(order)}
    band = tl.bins is not None
    heights = [max(0.26 * len(order), 0.8), 1.1] + ([0.35] if band else [])
    fig = Figure(figsize=(width_in, sum(heights) + 1.0), dpi=dpi)
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights, "hspace": 0.08})
    ax, cursor = axes[0], axes[1]
    times = [x / 1e9 for tr in (tl.true, tl.pred) for x in tr.time_ns[tr.valid]]
    lo, hi = min([0.0, *times]), max([tl.end_ns / 1e9, *times, 1e-3])
    pad = (hi - lo) * 0.01
    for side, track, lanes, dy, color in (("true", tl.true, true_lanes, 0.19, TRUE_COLOR),
                                          ("pred", tl.pred, pred_lanes, -0.19, PRED_COLOR)):
        alpha = 1.0 if side == "true" else 0.85
        press = (track.category == Category.KEYBOARD) & (track.action == 0)
        release = (track.category == Category.KEYBOARD) & (track.action == 1)
        for lane in order:
            y = row[lane] + dy
            if lane.startswith("key:"):
                bars, lead = _bars(track, lanes, lane, tl.end_ns, press, release)
                kind = "key"
            elif lane.startswith("button:"):
                _, down, up = next(b for b in BUTTON_LANES if f"button:{b[0]}" == lane)
                bars, lead = _bars(track, lanes, lane, tl.end_ns, (track.button_flags & down) > 0,
                                   (track.button_flags & up) > 0)
                kind = "button"
            else:
                continue
            if bars:
                ax.broken_barh(bars, (y - 0.15, 0.3), facecolors=color, edgecolors="white", linewidths=0.4,
                               alpha=alpha, gid=f"{kind}_bars:{side}")
            if len(lead):  # held since before the sequence
                ax.broken_barh([(lo - pad, t - lo + pad) for t in lead], (y - 0.15, 0.3), facecolors="none",
                               edgecolors=color, hatch="///", linewidths=0.4, gid=f"{kind}_held:{side}")
        for lane, bit in (("wheel", WHEEL), ("hwheel", HWHEEL)):
            if lane not in row:
                continue
            at = track.where(lanes == lane)
            for sign, marker in ((1, "^" if lane == "wheel" else ">"), (-1, "v" if lane == "wheel" else "<"),
                                 (0, "o")):
                pick = at[np.sign(track.button_data[at]) == sign]
                if len(pick):
                    ax.scatter(track.time_ns[pick] / 1e9, np.full(len(pick), row[lane] + dy), marker=marker, s=14,
                               color=color, linewidths=0, gid=f"{lane}_{'up down none'.split()[(1 - sign) % 3]}:{side}")
        for lane, size, faint in (("move", 40, 0.8), ("screen", 60, 0.25)):
            at = track.where(lanes == lane)
            if len(at):
                ax.scatter(track.time_ns[at] / 1e9, np.full(len(at), row[lane] + dy), marker="|", s=size,
                           color=color, alpha=faint, linewidths=0.6, gid=f"{lane}s:{side}")
        mouse = track.where(np.isin(track.category, (Category.MOUSE_OP, Category.MOUSE_NOP)))
        mouse = mouse[np.argsort(track.time_ns[mouse], kind="stable")]
        for axis, style in (("x", "-"), ("y", "--")):
            path = np.cumsum(getattr(track, f"d{axis}")[mouse])
            cursor.step(np.r_[lo, track.time_ns[mouse] / 1e9], np.r_[0, path], where="post", color=color,
                        linestyle=style, linewidth=0.9, alpha=alpha, gid=f"cursor_{axis}:{side}")

    def point(track, lanes, index, dy):
        return np.stack([track.time_ns[index] / 1e9, np.array([row[lanes[i]] for i in index]) + dy], 1) \
            if len(index) else np.zeros((0, 2))

    if len(tl.links):
        a, b = point(tl.true, true_lanes, tl.links[:, 0], 0.19), point(tl.pred, pred_lanes, tl.links[:, 1], -0.19)
        for pick, gid, color, style, words in ((tl.exact, "links:exact", EXACT_COLOR, "-", "matched"),
                                               (~tl.exact, "links:other", KIND_COLOR, "-", "paired, other detail")):
            if pick.any():
                ax.add_collection(LineCollection(np.stack([a[pick], b[pick]], 1), colors=color, linewidths=0.7,
                                                 linestyles=style, alpha=0.8, gid=gid, label=words))
    for index, track, lanes, dy, gid, color, marker, words in (
            (tl.misses, tl.true, true_lanes, 0.19, "misses", MISS_COLOR, "o", "miss (true, unpaired)"),
            (tl.false_alarms, tl.pred, pred_lanes, -0.19, "false_alarms", FALSE_ALARM_COLOR, "o",
             "false alarm (pred., unpaired)"),
            (tl.not_comparable, tl.true, true_lanes, 0.19, "not_comparable", UNCOMPARABLE_COLOR, "x",
             "other kind / no decode")):
        if len(index):
            xy = point(track, lanes, index, dy)
            paint = {"facecolors": "none", "edgecolors": color} if marker == "o" else {"color": color}
            ax.scatter(xy[:, 0], xy[:, 1], s=22, marker=marker, linewidths=1.0, zorder=5, gid=gid, label=words, **paint)
    handles = [Patch(color=TRUE_COLOR, label="true (upper half)"), Patch(color=PRED_COLOR, label="predicted (lower)"),
               *ax.get_legend_handles_labels()[0], Line2D([], [], color="black", linewidth=0.9, label="cursor x (Σ dx)"),
               Line2D([], [], color="black", linewidth=0.9, linestyle="--", label="cursor y (Σ dy)")]
    if band:
        handles += [Patch(color=AGREE_COLOR, label="bin's counts agree"),
                    Patch(color=DIFFER_COLOR, label="bin's counts differ")]
    legend = ax.legend(handles=handles, fontsize=6.5, loc="upper left", bbox_to_anchor=(1.002, 1.0), borderaxespad=0,
                       frameon=False)
    legend.set_gid("legend")
    ax.set_yticks([row[lane] for lane in order], [lane_label(lane) for lane in order], fontsize=7)
    ax.set_ylim(-len(order) + 0.5, 0.5)
    for y in range(len(order) - 1):
        ax.axhline(-y - 0.5, color="#dddddd", linewidth=0.5)
    ax.set_title(tl.title + (f"; {tl.undecoded_pred} predicted events do not decode" if tl.undecoded_pred else ""),
                 fontsize=8, fontweight="bold", loc="left")
    cursor.set_ylabel("cursor: Σ dx, Σ dy", fontsize=7)
    cursor.tick_params(labelsize=7)
    if band:
        _draw_bins(axes[2], tl.bins)
    axes[-1].set_xlabel("seconds from the sequence's origin", fontsize=7)
    axes[-1].tick_params(labelsize=7)
    axes[-1].set_xlim(lo - pad, hi + pad)
    height = fig.get_figheight()
    fig.subplots_adjust(left=1.0 / width_in, right=1 - 1.55 / width_in, top=1 - 0.35 / height, bottom=0.5 / height)
    return fig


def _draw_bins(ax, bins: Bins) -> None:
    for y, kind in ((0.5, "key"), (-0.5, "button")):
        state = bins.state(kind)
        for value, name, color in ((1, "agree", AGREE_COLOR), (0, "differ", DIFFER_COLOR)):
            at = np.flatnonzero(state == value)
            if len(at):
                ax.broken_barh([((bins.start_ns + i * bins.bin_ns) / 1e9, bins.bin_ns / 1e9) for i in at],
                               (y - 0.4, 0.8), facecolors=color, linewidths=0, gid=f"bins:{kind}:{name}")
    ax.set_yticks([0.5, -0.5], [f"keys / {bins.bin_ns / 1e6:g} ms", f"buttons / {bins.bin_ns / 1e6:g} ms"], fontsize=6.5)
    ax.set_ylim(-1, 1)


def timeline_counts(fig) -> dict[str, int]:
    """What a drawn timeline shows, read back from its artists: per ``gid``, the bars, links or markers drawn."""
    from matplotlib.collections import LineCollection, PathCollection

    counts: dict[str, int] = {}
    for ax in fig.axes:
        for artist in [*ax.collections, *ax.lines]:
            gid = artist.get_gid()
            if gid:
                n = len(artist.get_offsets()) if isinstance(artist, PathCollection) else \
                    len(artist.get_segments()) if isinstance(artist, LineCollection) else \
                    len(artist.get_paths()) if hasattr(artist, "get_paths") else len(artist.get_xdata())
                counts[gid] = counts.get(gid, 0) + n
    return counts
