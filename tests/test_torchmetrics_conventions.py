"""OWAEventMetrics as torchmetrics users compose metrics: torchmetrics' MetricTracker (and `OWAMetricTracker`, its
subclass whose compute_all and best_metric keep every key over steps whose keys differ, and read each key's
direction), `higher_is_better` per key, and `plot()` of the headline keys with torchmetrics' plotting."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from torchmetrics.wrappers import MetricTracker  # noqa: E402

from owa_metrics import OWAEventMetrics, OWAMetricTracker, VocabMap, build_tokenizer  # noqa: E402
from owa_metrics.events import simulate_session  # noqa: E402
from owa_metrics.functional.report import headline_keys  # noqa: E402

# by hand, from docs/METRICS.md's "better" column: which way each of these keys improves
BY_HAND = {"comparable_rate": True, "category/macro_f1": True, "token_accuracy/timestamp": True,
           "keyboard/accuracy": True, "timestamp/abs_error_p95_ms": False, "mouse/direction_error_p50_deg": False,
           "mouse/euclidean_iqmpe_pct": False, "keyboard/loss": False, "count/target_events": None,
           "timestamp/signed_error_iqm_ms": None, "keyboard/ratio": None, "status/invalid_target_rate": False,
           "keyboard/sequence_error_rate": False, "detect/f1_within_100ms": True, "tag/game/comparable_rate": True}


@pytest.fixture(scope="module")
def steps():
    """Three epochs' (preds, target): the true ids, each step with fewer tokens replaced by a wrong event token."""
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    rows = vocab.encode_sequences(simulate_session(10.0, seed=3), 384, ignore_images=True)[:3]
    labels = torch.tensor([row[:min(map(len, rows))] for row in rows])
    generator = torch.Generator().manual_seed(0)
    out = []
    for share in (0.3, 0.1, 0.03):
        preds = labels.clone()
        wrong = (torch.rand(labels.shape, generator=generator) < share) & (labels >= 0)
        preds[wrong] = vocab.ids["<5>"]
        out.append((preds, labels))
    return tokenizer, out


def _metric(tokenizer) -> OWAEventMetrics:
    return OWAEventMetrics(tokenizer, num_resamples=20)  # few bootstrap resamples: the CIs are not under test


def _track(tracker, steps):
    for preds, target in steps:
        tracker.increment()
        tracker.update(preds, target)
    return tracker


def test_higher_is_better_per_key():
    metric = OWAEventMetrics(build_tokenizer())
    assert {key: metric.higher_is_better[key] for key in BY_HAND} == BY_HAND
    neither = {key for key in headline_keys("generation") + headline_keys("teacher_forcing")
               if metric.higher_is_better[key] is None}
    assert neither == {"timestamp/signed_error_iqm_ms"}  # its best is 0


def test_metric_tracker_tracks_and_the_best_is_per_key(steps):
    tokenizer, steps = steps
    results = [_metric(tokenizer) for _ in steps]
    for metric, (preds, target) in zip(results, steps):
        metric.update(preds, target)
    results = [metric.compute() for metric in results]
    tracker = _track(MetricTracker(_metric(tokenizer)), steps)  # torchmetrics' own: maximize from the metric
    assert tracker.maximize is OWAEventMetrics.higher_is_better
    stacked = tracker.compute_all()
    assert stacked.keys() == results[0].keys()
    assert all(torch.equal(stacked[k], torch.stack([r[k] for r in results])) for k in results[0])

    best, step = _track(OWAMetricTracker(_metric(tokenizer)), steps).best_metric(return_step=True)
    for key, higher in BY_HAND.items():
        if key not in results[0]:
            continue
        values = [float(r[key]) for r in results]
        if higher is None:
            assert best[key] is None and step[key] is None, key
        else:
            want = max(values) if higher else min(values)
            assert best[key] == pytest.approx(want) and values[step[key]] == pytest.approx(want), key
    assert step["comparable_rate"] == 2 and step["timestamp/abs_error_p95_ms"] == 2  # fewest wrong tokens: last
    everything = _track(OWAMetricTracker(_metric(tokenizer), maximize=False), steps).best_metric()
    assert everything["comparable_rate"] == pytest.approx(min(float(r["comparable_rate"]) for r in results))


def test_plot_draws_the_headline_keys_over_steps(steps):
    tokenizer, steps = steps
    tracker = _track(MetricTracker(_metric(tokenizer)), steps)
    results = [tracker[i].compute() for i in range(1, len(tracker))]
    keys = [k for k in headline_keys("teacher_forcing") if k in results[0]]
    assert len(keys) >= 5
    for given in (results, tracker.compute_all()):  # a list of results, or the tracker's stacked dict
        fig, axes = tracker[-1].plot(given)
        panels = [ax for ax in axes.flat if ax.get_visible()]
        assert len(panels) == len(keys)
        for key, ax in zip(keys, panels):
            (line,) = ax.get_lines()
            assert list(line.get_ydata()) == pytest.approx([float(r[key]) for r in results]), key
    fig, axes = tracker[-1].plot()  # compute(): one point per key
    assert [float(ax.get_lines()[0].get_ydata()[0]) for ax in axes.flat if ax.get_visible()] == pytest.approx(
        [float(results[-1][k]) for k in keys])
    with pytest.raises(ValueError, match="one axes per key"):
        tracker[-1].plot(results, ax=[axes.flat[0]])


def test_tracker_keeps_every_key_when_the_keys_change_between_steps():
    """Step 0: tag a's sequences, every event token wrong (nothing comparable: no error keys); step 1: tag b's,
    right; step 2: tag a's, a tenth wrong. Keys come (step 1's errors, tag b) and go (tag a at step 1, tag b at
    step 2). Oracle: each step's report scored alone, and the union / NaN / best-over-present of plain Python."""
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    rows = vocab.encode_sequences(simulate_session(10.0, seed=3), 384, ignore_images=True)[:4]
    labels = torch.tensor([row[:min(map(len, rows))] for row in rows])
    none_right = labels.clone()
    none_right[labels >= 0] = vocab.ids["<5>"]
    some_wrong = labels.clone()
    some_wrong[(torch.rand(labels.shape, generator=torch.Generator().manual_seed(1)) < 0.1) & (labels >= 0)] = \
        vocab.ids["<5>"]
    steps = [(none_right[:2], labels[:2], [0, 0]), (labels[2:], labels[2:], [1, 1]),
             (some_wrong[:2], labels[:2], [0, 0])]

    def metric():
        return OWAEventMetrics(tokenizer, tags=["a", "b"], num_resamples=20)

    alone = []
    for preds, target, tags in steps:
        one = metric()
        one.update(preds, target, tags=torch.tensor(tags))
        alone.append({k: float(v) for k, v in one.compute().items()})
    union = []
    for report in alone:
        union += [k for k in report if k not in union]
    assert set(alone[0]) - set(alone[1]) and set(alone[1]) - set(alone[0]) and set(alone[1]) - set(alone[2])
    assert "timestamp/abs_error_p95_ms" not in alone[0] and "tag/b/comparable_rate" not in alone[2]

    tracker = OWAMetricTracker(metric())
    for preds, target, tags in steps:
        tracker.increment()
        tracker.update(preds, target, tags=torch.tensor(tags))
    stacked = tracker.compute_all()
    assert list(stacked) == union
    for key in union:
        want = [report.get(key, float("nan")) for report in alone]
        got = stacked[key].tolist()
        assert [g == w or (g != g and w != w) for g, w in zip(got, want)] == [True] * 3, key

    best, step = tracker.best_metric(return_step=True)
    assert list(best) == list(step) == union
    for key in union:
        higher = tracker.maximize[key]
        have = [(report[key], i) for i, report in enumerate(alone) if key in report]
        if higher is None:
            assert best[key] is None and step[key] is None, key
            continue
        want = have[0]
        for value, i in have[1:]:
            if (value > want[0]) if higher else (value < want[0]):
                want = (value, i)
        assert (best[key], step[key]) == want, key
    assert step["timestamp/abs_error_p95_ms"] == 1 and step["tag/a/comparable_rate"] == 2
    assert step["tag/b/comparable_rate"] == 1 and best["tag/b/comparable_rate"] == 1.0
