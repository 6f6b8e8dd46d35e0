"""The D2E protocol written from issue 31's text (plain Python over MCAP messages), and test MCAPs for it.

`oracle(truth_path, pred_path, bin_ms, empty_bins_as_correct, shift)` reads both files with the reader and computes
every key as the issue words it; nothing here imports owa_metrics. `write_mcap` writes a recording with
mcap_owa's writer; `convert_recording` turns a real recording (absolute mouse) into one with ``mouse/raw`` (dx, dy
the differences of consecutive positions, a click the raw flag of its button and direction).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import warnings
from fractions import Fraction

import numpy as np

FLAGS = {("left", True): 0x001, ("left", False): 0x002, ("right", True): 0x004, ("right", False): 0x008,
         ("middle", True): 0x010, ("middle", False): 0x020}
NAMES = [("left_down", 0x001), ("left_up", 0x002), ("right_down", 0x004), ("right_up", 0x008),
         ("middle_down", 0x010), ("middle_up", 0x020)]


def write_mcap(path, screens, keys=(), mice=(), tail_ns=None, in_time_order=True):
    """screens [(log_ns, pts_ns)] (pts None: no media_ref), keys [(log_ns, 'press'|'release', vk)], mice
    [(log_ns, dx, dy, flags[, us_flags])]; ``tail_ns``: one more screen message there (it sets the file's end time);
    ``in_time_order=False``: the messages written as listed (screens, keys, mice, tail), not sorted by time."""
    from mcap_owa.highlevel import OWAMcapWriter
    from owa.msgs.desktop.keyboard import KeyboardEvent
    from owa.msgs.desktop.mouse import RawMouseEvent
    from owa.msgs.desktop.screen import MediaRef, ScreenCaptured

    class NoMedia(ScreenCaptured):  # a screen message without media_ref (the model wants one to serialize)
        def serialize(self, buffer):
            buffer.write(json.dumps({"utc_ns": self.utc_ns, "source_shape": [8, 8], "shape": [8, 8]}).encode())

    messages = [(t, "screen", ScreenCaptured(utc_ns=t, media_ref=MediaRef(uri="video.mkv", pts_ns=pts),
                                             source_shape=(8, 8), shape=(8, 8)) if pts is not None else
                 NoMedia.model_construct(utc_ns=t)) for t, pts in screens]
    messages += [(t, "keyboard", KeyboardEvent(event_type=e, vk=vk)) for t, e, vk in keys]
    messages += [(t, "mouse/raw", RawMouseEvent(last_x=dx, last_y=dy, button_flags=f, button_data=0,
                                                us_flags=us[0] if us else 0)) for t, dx, dy, f, *us in mice]
    if tail_ns is not None:
        messages.append((tail_ns, "screen", ScreenCaptured(utc_ns=tail_ns, media_ref=MediaRef(uri="video.mkv",
                                                                                               pts_ns=0),
                                                           source_shape=(8, 8), shape=(8, 8))))
    if in_time_order:
        messages.sort(key=lambda m: m[0])
    with OWAMcapWriter(str(path)) as writer:
        for t, topic, msg in messages:
            writer.write_message(msg, topic=topic, timestamp=int(t))
    return path


def read_real(path):
    """A real recording's (screens' log times, keys [(t, type, vk)], mice [(t, dx, dy, flags)]) from its absolute
    mouse: dx, dy the differences of consecutive positions (from mouse/state), clicks as raw flags."""
    from mcap_owa.highlevel import OWAMcapReader

    screens, keys, mice, x, y = [], [], [], None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with OWAMcapReader(str(path)) as reader:
            for msg in reader.iter_messages(topics=["screen", "keyboard", "mouse", "mouse/state"]):
                if msg.topic == "screen":
                    screens.append(msg.timestamp)
                    continue
                d = msg.decoded
                if msg.topic == "mouse/state":
                    x, y = d.x, d.y
                elif msg.topic == "keyboard":
                    keys.append((msg.timestamp, d.event_type, d.vk))
                else:
                    dx, dy = (0, 0) if x is None else (d.x - x, d.y - y)
                    x, y = d.x, d.y
                    flags = FLAGS[d.button, bool(d.pressed)] if d.event_type == "click" else \
                        (0x400 if d.event_type == "scroll" else 0)
                    mice.append((msg.timestamp, dx, dy, flags))
    return screens, keys, mice


def convert_recording(src, dst, clock_ns=0, pts0_ns=0):
    """``src`` as a D2E recording: log times moved by ``clock_ns``, screens with pts from ``pts0_ns``."""
    screens, keys, mice = read_real(src)
    first = screens[0]
    move = lambda rows: [(r[0] + clock_ns, *r[1:]) for r in rows]  # noqa: E731
    return write_mcap(dst, [(t + clock_ns, pts0_ns + t - first) for t in screens], move(keys), move(mice))


def perturb(src, dst, seed, clock_ns, pts0_ns):
    """A plausible prediction of a real recording: its events jittered in time (+-40 ms), dx / dy scaled and
    noised, some keys and clicks dropped, on another clock."""
    rng = np.random.default_rng(seed)
    screens, keys, mice = read_real(src)
    first = screens[0]
    jitter = lambda: int(rng.integers(-40_000_000, 40_000_000))  # noqa: E731
    keys = [(t + jitter() + clock_ns, e, vk) for t, e, vk in keys if rng.random() > 0.2]
    mice = [(t + jitter() + clock_ns, int(dx * 1.5 + rng.integers(-3, 4)), int(dy * 0.7 + rng.integers(-3, 4)), f)
            for t, dx, dy, f in mice if f == 0 or rng.random() > 0.3]
    return write_mcap(dst, [(t + clock_ns, pts0_ns + t - first) for t in screens], keys, mice)


@functools.lru_cache(maxsize=None)
def _read(path):
    from mcap_owa.highlevel import OWAMcapReader

    with OWAMcapReader(str(path)) as reader:
        screen = next(iter(reader.iter_messages(topics=["screen"])))
        offset = screen.timestamp - screen.decoded.media_ref.pts_ns
        pts = screen.decoded.media_ref.pts_ns
        end = pts + (reader.end_time - screen.timestamp)
        events = [(m.timestamp - offset, m.topic, m.decoded) for m in
                  reader.iter_messages(topics=["keyboard", "mouse/raw"])]
    return pts, end, events


def oracle(truth_path, pred_path, bin_ms, empty_bins_as_correct=False, shift=0):
    """Every key of the protocol (a none left out; ``num_bins``: the bins compared), at shift k: true bin i against
    predicted bin i + k, over the bins where both exist."""
    t0, t1, t_events = _read(str(truth_path))
    p0, p1, p_events = _read(str(pred_path))
    start, end = max(t0, p0), min(t1, p1)
    assert end > start
    return oracle_events(t_events, p_events, start, end, bin_ms, empty_bins_as_correct, shift)


def pearson(ts, ps):
    """Pearson's r of two lists of integers, exact (`fractions`; one rounding at the end): None below 2 values or
    with a constant list."""
    if len(ts) < 2:
        return None
    mt, mp = Fraction(sum(ts), len(ts)), Fraction(sum(ps), len(ps))
    cov = sum((x - mt) * (y - mp) for x, y in zip(ts, ps))
    vt, vp = sum((x - mt) ** 2 for x in ts), sum((y - mp) ** 2 for y in ps)
    if vt == 0 or vp == 0:
        return None
    return math.copysign(math.sqrt(cov * cov / (vt * vp)), cov)


def oracle_events(t_events, p_events, start, end, bin_ms, empty_bins_as_correct=False, shift=0):
    """The keys from events (time, topic, decoded-like object with dx / dy / button_flags or event_type / vk)."""
    size = int(round(bin_ms * 1e6))
    bins = []
    b = start
    while b < end:
        bins.append((b, min(b + size, end)))
        b = min(b + size, end)

    starts = [a for a, _ in bins]

    def per_bin(events):
        out = [{"moves": [], "buttons": {}, "keys": {}} for _ in bins]
        for t, topic, d in events:
            if not start <= t <= end:
                continue
            i = bisect.bisect_right(starts, t) - 1  # the bin that starts at or before t
            if t >= bins[i][1]:  # at or after the last bin's end
                continue
            if topic == "mouse/raw":
                if int(d.button_flags) == 0:
                    out[i]["moves"].append((d.dx, d.dy))
                for name, bit in NAMES:
                    if int(d.button_flags) & bit:
                        out[i]["buttons"][name] = out[i]["buttons"].get(name, 0) + 1
            else:
                name = f"{d.event_type}_{d.vk}"
                out[i]["keys"][name] = out[i]["keys"].get(name, 0) + 1
        return out

    T, P = per_bin(t_events), per_bin(p_events)
    pairs = [(T[i], P[i + shift]) for i in range(len(bins)) if 0 <= i + shift < len(bins)]
    keys = {"num_bins": len(pairs), "duration_s": (end - start) / 1e9}
    for axis, j in (("x", 0), ("y", 1)):
        ts, ps, all_t, all_p = [], [], [], []
        for a, b in pairs:
            ta, pa = sum(m[j] for m in a["moves"]), sum(m[j] for m in b["moves"])
            if a["moves"] or b["moves"]:
                ts.append(ta)
                ps.append(pa)
            all_t.append(ta)
            all_p.append(pa)
        # the script's r: the bins where either side moved; the paper's (issue 46): every bin compared
        for name, r in ((f"pearson_{axis}", pearson(ts, ps)), (f"pearson_{axis}_all_bins", pearson(all_t, all_p))):
            if r is not None:
                keys[f"mouse_move/{name}"] = r
        all_t, all_p = [abs(x) for x in all_t], [abs(x) for x in all_p]
        mean_t, mean_p = Fraction(sum(all_t), len(all_t)), Fraction(sum(all_p), len(all_p))
        if mean_p > 0:
            r = mean_t / mean_p
            keys[f"mouse_move/scale_ratio_{axis}"] = float(r if r >= 1 else (1 / r if r > 0 else math.inf))
        keys["mouse_move/sample_count"] = len(ts)
    for kind, name in (("buttons", "mouse_button/button_accuracy"), ("keys", "keyboard/key_accuracy")):
        values = []
        for a, b in pairs:
            names = set(a[kind]) | set(b[kind])
            if not names:
                if empty_bins_as_correct:
                    values.append(1.0)
                continue
            values += [1.0 if a[kind].get(x, 0) == b[kind].get(x, 0) else 0.0 for x in names]
        if values:
            keys[name] = sum(values) / len(values)
        keys[name.split("/")[0] + "/sample_count"] = len(values)
    keys.update(strict_oracle(pairs))
    return keys


def strict_oracle(pairs):
    """fdm-d2e-reproduction's "strict" per-bin keys, as its paper_idm_metrics.py counts them over (true bin,
    predicted bin) pairs: keyboard, the bins with a true key whose key counts are all equal / the bins with a true
    key; buttons, per bin with a true button: TP when all counts are equal, else FN (and FP when the prediction has a
    button), per bin without: FP when the prediction has a button; precision, recall, F1 of TP / FP / FN; each
    kind's FP rate over the bins without a true event. A ratio over nothing is left out."""
    keys = {}
    strict = [a["keys"] == b["keys"] for a, b in pairs if a["keys"]]
    keys["keyboard/strict_sample_count"] = len(strict)
    if strict:
        keys["keyboard/strict_accuracy"] = sum(strict) / len(strict)
    tp = fp = fn = 0
    for a, b in pairs:
        if a["buttons"]:
            if a["buttons"] == b["buttons"]:
                tp += 1
            else:
                fn += 1
                fp += bool(b["buttons"])
        else:
            fp += bool(b["buttons"])
    for name, num, den in (("precision", tp, tp + fp), ("recall", tp, tp + fn), ("f1", 2 * tp, 2 * tp + fp + fn)):
        if den:
            keys[f"mouse_button/{name}"] = num / den
    for kind, field in (("keyboard", "keys"), ("mouse_button", "buttons")):
        without = [bool(b[field]) for a, b in pairs if not a[field]]
        keys[f"{kind}/false_positive_sample_count"] = len(without)
        if without:
            keys[f"{kind}/false_positive_rate"] = sum(without) / len(without)
    return keys
