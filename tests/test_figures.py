"""The figures show the events: what a timeline drew, read back from its matplotlib artists, against the events it
was made of (counted here in plain Python) and against each sequence's own report."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from owa_metrics import Event, OWAEventMetrics, decode_batch
from owa_metrics.events import simulate_session
from owa_metrics.figures import batch_timelines, draw_latency_curve, draw_timeline, timeline_counts

BIN_MS = 50
UNIT = 10_000_000  # the formats' 10 ms timestamp unit


def _session(seed: int, seconds: float = 6.0) -> list[Event]:
    """A simulated session's actions and screens, on the 10 ms grid and within both formats' windows."""
    return [replace(e, timestamp_ns=e.timestamp_ns // UNIT * UNIT) for e in simulate_session(seconds, seed=seed)]


def _guess(events: list[Event], seed: int) -> list[Event]:
    """A model's guess of ``events``: 30 ms late, every 6th action left out, every 4th key another key, a stray
    click."""
    rng = np.random.default_rng(seed)
    out = []
    for i, e in enumerate(events):
        if e.kind != "screen" and i % 6 == 0:
            continue
        e = replace(e, timestamp_ns=e.timestamp_ns + 3 * UNIT)
        if e.kind == "keyboard" and i % 4 == 0:
            e = replace(e, vk=int(rng.integers(65, 91)))
        out.append(e)
    out.append(Event(kind="mouse", timestamp_ns=events[-1].timestamp_ns + UNIT, dx=0, dy=0, button_flags=0x001))
    return out


def _ids(vocab, sequences):
    rows = [vocab.encode(events, ignore_images=True) for events in sequences]
    width = max(map(len, rows))
    return torch.tensor([row + [-100] * (width - len(row)) for row in rows])


def _presses(events, side_events=None) -> int:
    return sum(e.kind == "keyboard" and e.action == "press" for e in events)


def _downs(events) -> int:
    return sum(bin(e.button_flags & 0x155).count("1") for e in events if e.kind == "mouse" and e.button_flags)


def _bins_oracle(truth: list[Event], guess: list[Event], bin_ns: int) -> tuple[int, int, int]:
    """(bins, bins whose key counts agree, bins with a key on either side) by the D2E protocol's words: bins of
    bin_ns from the first true event to the last (which closes the range), key names (vk, action) counted per bin."""
    actions = [e for e in truth if e.kind != "screen"]  # screens are context: the metric leaves them out
    start, end = actions[0].timestamp_ns, actions[-1].timestamp_ns
    count = [Counter(((e.timestamp_ns - start) // bin_ns, e.vk, e.action) for e in side
                     if e.kind == "keyboard" and start <= e.timestamp_ns < end) for side in (truth, guess)]
    bins = {b for b, _, _ in count[0] | count[1]}
    agree = sum(all(count[0][key] == count[1][key] for key in count[0] | count[1] if key[0] == b) for b in bins)
    return -(-(end - start) // bin_ns), agree, len(bins)


@pytest.mark.parametrize("alignment, pairing", [("teacher_forcing", "index"), ("generation", "index"),
                                                ("generation", "time")])
def test_a_timeline_draws_the_events_and_the_sequences_own_report(format_vocab, alignment, pairing):
    vocab = format_vocab
    truths = [_session(0), _session(1)]
    guesses = [_guess(truths[0], 0), _guess(truths[1], 1)]
    target = _ids(vocab, truths)
    if alignment == "teacher_forcing":  # the guess's tokens at the true ones' places: every 9th token another
        preds = target.clone()
        preds[:, ::9] = torch.where(preds[:, ::9] >= 0, (preds[:, ::9] + 7) % vocab.size, preds[:, ::9])
    else:
        preds = _ids(vocab, guesses)
    tags = ["minecraft", "vscode"]
    kwargs = dict(alignment=alignment, pairing=pairing, bin_ms=BIN_MS, tags=tags)
    metric = OWAEventMetrics(vocab=vocab, **kwargs)
    batch = decode_batch(*metric.scored_ids(preds, target), vocab, alignment, pairing=pairing)
    context = decode_batch(target, target, vocab) if alignment == "generation" else None  # screens, unscored
    timelines = batch_timelines(batch, vocab.config.timestamp_window_ns, [0, 1], BIN_MS, tags, context=context)
    for b, timeline in enumerate(timelines):
        alone = OWAEventMetrics(vocab=vocab, **kwargs)  # the sequence's own report
        alone.update(preds[b:b + 1], target[b:b + 1], tags=[tags[b]])
        report = {k: float(v) for k, v in alone.compute().items()}
        fig = draw_timeline(timeline)
        drawn = timeline_counts(fig)
        truth = truths[b]
        if alignment == "generation":  # what the figure's predicted side holds: the guess's events
            assert drawn.get("key_bars:pred", 0) == _presses(guesses[b])
            assert drawn.get("button_bars:pred", 0) == _downs(guesses[b])
        assert drawn["key_bars:true"] == _presses(truth) > 0
        assert drawn["button_bars:true"] == _downs(truth) > 0
        screens = [e.timestamp_ns for e in truth if e.kind == "screen"]
        assert drawn["screens:true"] == len(screens) > 0  # generation: drawn as context, the metric leaves them out
        origin = next(e.timestamp_ns for e in truth if e.kind != "screen" or alignment == "teacher_forcing")
        ticks = [a for a in fig.axes[0].collections if a.get_gid() == "screens:true"][0].get_offsets()[:, 0]
        assert sorted(ticks) == pytest.approx([(t - origin) / 1e9 for t in screens])  # on the events' axis
        links = drawn.get("links:exact", 0) + drawn.get("links:other", 0)
        assert links == report["count/comparable"] > 0
        assert drawn.get("misses", 0) == report.get("count/missing_events", 0)
        assert drawn.get("false_alarms", 0) == report.get("count/extra_events", 0)
        decoded = report["count/target_events"] - report.get("status/invalid_target", 0)
        assert drawn.get("not_comparable", 0) == decoded - report["count/comparable"] - report.get(
            "count/missing_events", 0)
        if pairing == "time":
            assert drawn["misses"] > 0 and drawn["false_alarms"] > 0
            matched = report["detect/recall"] * report["count/valid_target_events"]
            assert drawn["links:exact"] == pytest.approx(matched)
            assert f"detection F1 {report['detect/f1']:.2f}" in timeline.title
        else:
            assert f"comparable {report['comparable_rate']:.0%}" in timeline.title
        assert timeline.title.startswith(f"{tags[b]}: ")
        legend = {text.get_text() for text in fig.axes[0].get_legend().get_texts()}
        assert {"true (upper half)", "predicted (lower)", "matched", "bin's counts agree"} <= legend
        if drawn.get("misses"):
            assert "miss (true, unpaired)" in legend
        # the D2E band: the sequence's bins, coloured where its key counts agree (the report's accuracy pools them)
        bins = timeline.bins
        assert bins.num_bins == report["d2e/num_bins"]
        assert bins.key_right.sum() / bins.key_values.sum() == pytest.approx(report["d2e/keyboard/key_accuracy"])
        if alignment == "generation" and pairing == "index":  # the guess's times, as written
            n, agree, with_key = _bins_oracle(truth, guesses[b], BIN_MS * 1_000_000)
            assert (bins.num_bins, drawn.get("bins:key:agree", 0)) == (n, agree)
            assert drawn.get("bins:key:agree", 0) + drawn.get("bins:key:differ", 0) == with_key
        cursor = [line for line in fig.axes[1].get_lines() if line.get_gid() == "cursor_x:true"][0]
        assert cursor.get_ydata()[-1] == sum(e.dx for e in truth if e.kind == "mouse")


def test_the_latency_curve_peaks_where_the_prediction_is_late(vocab):
    """A guess that is exactly the truth 100 ms (2 bins) late scores every key and button right at shift +2."""
    truth = [e for e in _session(3, 8.0) if e.kind != "screen"]
    late = [replace(e, timestamp_ns=e.timestamp_ns + 10 * UNIT) for e in truth]
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", bin_ms=BIN_MS, bin_shifts=range(-3, 4))
    metric.update(_ids(vocab, [late]), _ids(vocab, [truth]))
    report = {k: float(v) for k, v in metric.compute().items()}
    fig = draw_latency_curve(report, BIN_MS)
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines() if line.get_gid()}
    keys = lines["latency:keyboard/key_accuracy"]
    assert list(keys.get_xdata()) == list(range(-3, 4))
    assert keys.get_ydata()[5] == 1.0 and max(keys.get_ydata()[:5]) < 1.0
    assert lines["latency:mouse_button/button_accuracy"].get_ydata()[5] == 1.0
    pearson = lines["latency:mouse_move/pearson"].get_ydata()
    assert pearson[5] > 0.99 and np.argmax(pearson) == 5
    assert list(lines["latency:best"].get_xdata()) == [2, 2]
    assert draw_latency_curve({k: v for k, v in report.items() if "bins" not in k}, BIN_MS) is None
