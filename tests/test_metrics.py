import math

import matplotlib
import numpy as np
import pytest
import torch
from torchmetrics import MetricCollection

from owa_metrics import (
    IQMPE, DigitPrecisionAccuracy, DirectionError, Event, EuclideanPercentError, KeyboardAccuracy,
    MouseActionAccuracy, MovementR2, OWAEventMetrics, SignedPercentError, TimestampError, compute_metrics_for_event,
)
from owa_metrics import functional as F
from owa_metrics.events import read_recording, simulate_session
from conftest import recording_paths
from metric_oracle import oracle_report, perturb
from oracles import close, normalized, np_bootstrap_ci, np_iqm

matplotlib.use("Agg")

# every target event has exactly one prediction under teacher forcing: these apply to generation only
GENERATION_ONLY_KEYS = ["count_accuracy", "count/pred_events", "count/extra_events", "count/missing_events",
                        "status/missing"]
REQUIRED = [
    "comparable_rate", "timestamp/abs_error_p95_ms", "timestamp/signed_error_iqm_ms",
    "timestamp/signed_error_ci_low_ms", "timestamp/signed_error_ci_high_ms", "timestamp/iqmpe_pct",
    "timestamp/precision_p1", "timestamp/precision_p2", "timestamp/precision_p3", "mouse/euclidean_pe_p95_pct",
    "mouse/signed_pe_x_iqm_pct", "mouse/signed_pe_x_ci_low_pct", "mouse/signed_pe_x_ci_high_pct",
    "mouse/signed_pe_y_iqm_pct", "mouse/direction_error_p50_deg", "mouse/direction_error_p95_deg",
    "mouse/dx_iqmpe_pct", "mouse/dy_iqmpe_pct", "mouse/euclidean_iqmpe_pct", "mouse/dx_precision_p4",
    "mouse/euclidean_precision_p1", "mouse/action_accuracy", "keyboard/accuracy", "keyboard/vk_accuracy",
    "keyboard/action_accuracy", "category/macro_f1", "keyboard/ratio", "mouse_nop/comparable_rate",
    "screen/timestamp/signed_error_iqm_ms", "mouse_nop/timestamp/precision_p3",
]


# --------------------------------------------------------------------------- single metrics vs numpy
def test_single_metrics_equal_numpy():
    rng = np.random.default_rng(0)
    p, t = rng.integers(-500, 500, size=(2, 300))
    t[:20] = 0
    m = IQMPE()
    m.update(torch.from_numpy(p[:100]), torch.from_numpy(t[:100]))
    m.update(torch.from_numpy(p[100:]), torch.from_numpy(t[100:]))
    keep = t != 0
    want = np_iqm(np.abs(p[keep] - t[keep]) / np.abs(t[keep]) * 100)
    assert close(m.compute(), want) and close(F.iqmpe(torch.from_numpy(p), torch.from_numpy(t)), want)

    signed = SignedPercentError()
    signed.update(torch.from_numpy(p), torch.from_numpy(t))
    pe = (p[keep] - t[keep]) / t[keep] * 100
    res = signed.compute()
    assert close(res["iqm_pct"], np_iqm(pe)) and close(res["ci_low_pct"], np_bootstrap_ci(pe)[0])

    vp, vt = rng.normal(size=(2, 300, 2)) * 50
    vt[:5] = 0
    d = DirectionError()
    d.update(torch.from_numpy(vp), torch.from_numpy(vt))
    nz = (vt != 0).any(1)
    delta = np.abs(np.arctan2(vp[nz, 1], vp[nz, 0]) - np.arctan2(vt[nz, 1], vt[nz, 0]))
    angles = np.degrees(np.minimum(delta, 2 * np.pi - delta))
    res = d.compute()
    assert close(res["p50_deg"], np.percentile(angles, 50)) and close(res["p95_deg"], np.percentile(angles, 95))
    twin = F.direction_error(torch.from_numpy(vp), torch.from_numpy(vt))
    assert close(twin["p50_deg"], np.percentile(angles, 50)) and close(twin["p95_deg"], np.percentile(angles, 95))

    e = EuclideanPercentError()
    e.update(torch.from_numpy(vp), torch.from_numpy(vt))
    eu = np.linalg.norm(vp[nz] - vt[nz], axis=1) / np.linalg.norm(vt[nz], axis=1) * 100
    assert close(e.compute()["p95_pct"], np.percentile(eu, 95)) and close(e.compute()["iqmpe_pct"], np_iqm(eu))

    r2 = MovementR2()
    r2.update(torch.from_numpy(vp[:150]), torch.from_numpy(vt[:150]))
    r2.update(torch.from_numpy(vp[150:]), torch.from_numpy(vt[150:]))
    assert close(r2.compute(), 1 - ((vp - vt) ** 2).sum() / ((vt - vt.mean(0)) ** 2).sum())
    assert close(F.movement_r2(torch.from_numpy(vp), torch.from_numpy(vt)),
                 1 - ((vp - vt) ** 2).sum() / ((vt - vt.mean(0)) ** 2).sum())

    ts = TimestampError()
    pt, tt = rng.integers(0, 1600, size=(2, 400)) * 10_000_000
    ts.update(torch.from_numpy(pt), torch.from_numpy(tt))
    s = ((pt - tt + 8 * 10**9) % (16 * 10**9) - 8 * 10**9) / 1e6
    res = ts.compute()
    assert close(res["abs_error_p95_ms"], np.percentile(np.abs(s), 95))
    assert close(res["signed_error_iqm_ms"], np_iqm(s))
    assert close(res["signed_error_ci_high_ms"], np_bootstrap_ci(s)[1])
    assert close(res["iqmpe_pct"], np_iqm(np.abs(s[tt != 0]) / (tt[tt != 0] / 1e6) * 100))
    twin = F.timestamp_error(torch.from_numpy(pt), torch.from_numpy(tt), 16 * 10**9)
    assert close(twin["signed_error_ci_low_ms"], np_bootstrap_ci(s)[0]) and close(twin["abs_error_p95_ms"],
                                                                                np.percentile(np.abs(s), 95))


def test_discrete_metrics_by_hand():
    dp = DigitPrecisionAccuracy(3)
    dp.update(torch.tensor([[0, 2, 5], [2, 2, 5], [1, 1, 1]]), torch.tensor([[3, 2, 5], [2, 2, 7], [1, 1, 1]]))
    assert dp.compute().tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    kb = KeyboardAccuracy()
    kb.update(torch.tensor([65, 66, 67, 68]), torch.tensor([0, 1, 0, 0]), torch.tensor([65, 66, 0, 68]),
              torch.tensor([0, 0, 0, 0]), seq_idx=torch.tensor([0, 0, 0, 1]))
    res = kb.compute()
    assert (res["vk_accuracy"], res["action_accuracy"], res["accuracy"]) == (0.75, 0.75, 0.5)
    assert res["accuracy_seq_macro"] == pytest.approx(2 / 3)  # sequence 0: 1 of 3 right, sequence 1: 1 of 1
    twin = F.keyboard_accuracy(torch.tensor([65, 66, 67, 68]), torch.tensor([0, 1, 0, 0]), torch.tensor([65, 66, 0, 68]),
                               torch.tensor([0, 0, 0, 0]))
    assert (twin["vk_accuracy"], twin["action_accuracy"], twin["accuracy"]) == (0.75, 0.75, 0.5)
    ma = MouseActionAccuracy()
    ma.update(torch.tensor([1, 2, 0, 0x400]), torch.tensor([0, 0, 0, -120]), torch.tensor([1, 4, 0, 0x400]),
              torch.tensor([0, 0, 0, 120]))
    assert ma.compute()["action_accuracy"] == pytest.approx(2 / 3) and ma.compute()["scroll_accuracy"] == 0
    twin = F.mouse_action_accuracy(torch.tensor([1, 2, 0, 0x400]), torch.tensor([0, 0, 0, -120]),
                                   torch.tensor([1, 4, 0, 0x400]), torch.tensor([0, 0, 0, 120]))
    assert twin["action_accuracy"] == pytest.approx(2 / 3) and twin["scroll_accuracy"] == 0


def test_torchmetrics_conventions():
    metrics = [IQMPE(), DirectionError(), TimestampError(), SignedPercentError(), EuclideanPercentError(),
               MovementR2(), DigitPrecisionAccuracy(3), KeyboardAccuracy(), MouseActionAccuracy()]
    for m in metrics:
        assert m.full_state_update is False and m.is_differentiable is False
        assert hasattr(m, "higher_is_better")
    collection = MetricCollection({"iqmpe": IQMPE(), "pe": SignedPercentError(mode="sketch")})
    collection.update(torch.tensor([1.0, 2, 3, 5]), torch.tensor([2.0, 2, 2, 2]))
    out = collection.compute()
    assert close(out["iqmpe"], np_iqm([50, 0, 50, 150])) and "iqm_pct" in out  # dict results are flattened
    a, b, whole = IQMPE(), IQMPE(), IQMPE()
    a.update(torch.tensor([1.0, 5]), torch.tensor([2.0, 2]))
    b.update(torch.tensor([3.0, 9, 4]), torch.tensor([2.0, 3, 1]))
    whole.update(torch.tensor([1.0, 5, 3, 9, 4]), torch.tensor([2.0, 2, 2, 3, 1]))
    a.merge_state(b)
    assert a.compute() == whole.compute()
    fig, _ = whole.plot()
    assert fig is not None
    fig, _ = DirectionError().plot({"p50_deg": torch.tensor(3.0), "p95_deg": torch.tensor(40.0)})
    assert fig is not None


def test_empty_metrics_return_nan_and_the_report_leaves_them_out(tokenizer):
    assert torch.isnan(IQMPE().compute())
    assert torch.isnan(DirectionError().compute()["p95_deg"])
    assert torch.isnan(TimestampError(mode="sketch").compute()["signed_error_ci_low_ms"])
    report = OWAEventMetrics(tokenizer)
    report.update(torch.full((2, 5), -100), torch.full((2, 5), -100))
    out = report.compute()
    assert not any(math.isnan(v) for v in out.values())
    assert out["count/target_events"] == 0 and out["count/sequences"] == 2 and "count_accuracy" not in out
    assert "comparable_rate" not in out and "timestamp/signed_error_iqm_ms" not in out


# --------------------------------------------------------------------------- the report vs the oracle
def _batch_from(vocab, sequences, rng, corrupt=0.0, normalize=normalized, ignore_images=True):
    """Token ids of (pred_events, true_events) sequences; some predicted events get their end token replaced
    by a digit (so they do not decode). Returns preds, target and the oracle's input."""
    preds, targets, oracle_input = [], [], []
    for pred_events, true_events in sequences:
        valid = []
        ids = []
        for e in pred_events:
            tokens = vocab.encode([e])
            if rng.random() < corrupt:
                tokens[-1] = vocab.ids["<5>"]
                valid.append(False)
            else:
                valid.append(True)
            ids += tokens
        # a corrupted event runs into the next one: its span is cut at the next start, the next one is intact
        preds.append(ids)
        targets.append(vocab.encode(true_events, ignore_images=ignore_images))
        oracle_input.append(([normalize(e) for e in pred_events], [normalize(e) for e in true_events], valid))
    pad = lambda rows: torch.tensor([r + [-100] * (max(map(len, rows)) - len(r)) for r in rows])  # noqa: E731
    return pad(preds), pad(targets), oracle_input


def _compare(report: dict, oracle: dict):
    missing = [k for k in oracle if k not in report]
    assert not missing, missing
    bad = {k: (float(report[k]), v) for k, v in oracle.items() if not close(report[k], v)}
    assert not bad, bad


def _chunks(events, rng, sizes=(20, 200)):
    out, i = [], 0
    while i < len(events):
        n = int(rng.integers(*sizes))
        out.append(events[i:i + n])
        i += n
    return out


def test_report_equals_oracle_on_recordings_generation(tokenizer):
    rng = np.random.default_rng(11)
    metric = OWAEventMetrics(tokenizer, alignment="generation", generated_screens="scored")
    oracle_in = []
    for path in recording_paths():
        chunks = _chunks(read_recording(path), rng)
        for lo in range(0, len(chunks), 4):  # several update() calls
            seqs = [(perturb(c, rng), c) for c in chunks[lo:lo + 4]]
            preds, target, inp = _batch_from(metric.vocab, seqs, rng, corrupt=0.02)
            metric.update(preds, target)
            oracle_in += inp
    report = metric.compute()
    oracle = oracle_report(oracle_in)
    _compare(report, oracle)
    assert all(k in report for k in REQUIRED + GENERATION_ONLY_KEYS)
    assert report["count/extra_events"] > 0 and report["count/missing_events"] > 0 and report["count_accuracy"] < 1


def test_report_equals_oracle_teacher_forcing_with_logits(tokenizer):
    rng = np.random.default_rng(5)
    metric = OWAEventMetrics(tokenizer)
    vocab = metric.vocab
    events = simulate_session(40, seed=3)
    seqs = [(perturb(c, rng, change_kinds=False), c) for c in _chunks(events, rng, (10, 60))][:12]
    preds, target, oracle_in = _batch_from(vocab, seqs, rng)
    preds = torch.where(target < 0, 0, preds)  # whatever the model says at ignored positions
    logits = torch.from_numpy(rng.normal(size=(*target.shape, vocab.size))).float()
    metric.update(preds, target, logits=logits)
    report = metric.compute()
    oracle = oracle_report(oracle_in)
    assert not set(GENERATION_ONLY_KEYS) & set(report)  # constants under teacher forcing: left out
    _compare(report, {k: v for k, v in oracle.items() if k not in GENERATION_ONLY_KEYS})
    # per-category loss: summed token cross-entropy of each target event, averaged over the category's events
    lg = logits.double().numpy()
    logp = lg - lg.max(-1, keepdims=True) - np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1, keepdims=True))
    per_cat = {c: [] for c in ["keyboard", "mouse_op", "mouse_nop", "screen"]}
    correct = {"timestamp": [0, 0], "vk": [0, 0], "mouse_delta": [0, 0], "button_flags": [0, 0]}
    for b, (_, truths, _) in enumerate(oracle_in):
        pos = 0
        for e in truths:
            n = len(vocab.encode([e]))
            labels = target[b, pos:pos + n].numpy()
            per_cat[e.category.name.lower()].append(
                sum(-logp[b, pos + i, label] for i, label in enumerate(labels) if label >= 0))
            fields = {2: "timestamp", 3: "timestamp", 4: "timestamp"}
            if e.kind == "keyboard":
                fields[5] = "vk"
            if e.kind == "mouse":
                fields.update({i: "mouse_delta" for i in range(5, 13)})
                fields.update({i: "button_flags" for i in range(13, 16)})
            for i, name in fields.items():
                correct[name][0] += int(preds[b, pos + i] == target[b, pos + i])
                correct[name][1] += 1
            pos += n
    for cat, losses in per_cat.items():
        if losses:
            assert close(report[f"{cat}/loss"], np.mean(losses), 1e-5)
            assert close(report[f"{cat}/loss_sum"], np.sum(losses), 1e-5)
    for name, (right, total) in correct.items():
        assert close(report[f"token_accuracy/{name}"], right / total)


def test_sketch_mode_report_is_close_to_exact(tokenizer):
    rng = np.random.default_rng(2)
    exact, sketch = OWAEventMetrics(tokenizer, alignment="generation"), OWAEventMetrics(
        tokenizer, alignment="generation", mode="sketch")
    events = simulate_session(120, seed=9)
    seqs = [(perturb(c, rng), c) for c in _chunks(events, rng, (50, 150))]
    preds, target, _ = _batch_from(exact.vocab, seqs, rng)
    exact.update(preds, target)
    sketch.update(preds, target)
    e, s = exact.compute(), sketch.compute()
    assert set(e) == set(s)
    for k in e:
        if k.endswith(("_p95_ms", "_p50_deg", "_p95_deg", "_p95_pct")):
            assert abs(s[k] - e[k]) <= 0.005 * abs(e[k]) + 1e-9, k
        elif k.endswith(("ratio", "rate", "accuracy", "macro_f1")) or k.startswith(("count/", "status/")):
            assert s[k] == e[k], k


def test_reset_and_merge_state(tokenizer):
    rng = np.random.default_rng(4)
    events = simulate_session(30, seed=1)
    seqs = [(perturb(c, rng), c) for c in _chunks(events, rng, (30, 80))]
    preds, target, _ = _batch_from(OWAEventMetrics(tokenizer).vocab, seqs, rng)
    whole, a, b = (OWAEventMetrics(tokenizer, alignment="generation") for _ in range(3))
    whole.update(preds, target)
    half = preds.shape[0] // 2
    a.update(preds[:half], target[:half])
    b.update(preds[half:], target[half:])
    a.merge_state(b)
    merged, single = a.compute(), whole.compute()
    assert merged.keys() == single.keys() and all(close(merged[k], single[k], 1e-12) for k in single)
    whole.reset()
    assert whole.compute()["count/target_events"] == 0


# --------------------------------------------------------------------------- seed 004's per-pair API
def test_compute_metrics_for_event_structure_and_values(codec):
    truth = [Event(kind="keyboard", timestamp_ns=250_000_000, vk=65, action="press"),
             Event(kind="mouse", timestamp_ns=2_250_000_000, dx=10, dy=0),
             Event(kind="screen", timestamp_ns=2_300_000_000)]
    pred = [Event(kind="keyboard", timestamp_ns=3_250_000_000, vk=65, action="release"),  # <3><2><5> vs <0><2><5>
            Event(kind="mouse", timestamp_ns=2_270_000_000, dx=-10, dy=0),  # <2><2><7> vs <2><2><5>, 180 degrees
            Event(kind="keyboard", timestamp_ns=2_300_000_000, vk=1, action="press"),
            Event(kind="screen", timestamp_ns=0)]
    r = compute_metrics_for_event("".join(map(codec.encode, pred)), "".join(map(codec.encode, truth)))
    first, second, third = r["event_comparisons"]
    assert first["timestamp_precision_match"] == {"p1": False, "p2": False, "p3": False}
    assert first["keyboard_metrics"] == {"vk_match": True, "action_match": False, "combined_match": False, "loss": None}
    assert second["timestamp_precision_match"] == {"p1": True, "p2": True, "p3": False}
    assert second["mouse_metrics"]["dx_percent_error"] == 200.0 and second["mouse_metrics"]["direction_error_deg"] == 180
    assert second["mouse_metrics"]["dy_percent_error"] is None
    assert third["comparison_status"] == "type_mismatch" and not third["comparable"]
    assert (third["predicted_type"], third["ground_truth_type"]) == ("keyboard", "screen")
    assert (r["predicted_count"], r["ground_truth_count"], r["count_accuracy"]) == (4, 3, 0.0)
    assert r["comparable_rate"] == pytest.approx(2 / 3)
    assert r["keyboard_metrics"]["vk_accuracy"] == 1.0 and r["keyboard_metrics"]["combined_accuracy"] == 0.0
    assert r["screen_metrics"] == {"timestamp_iqmpe": None, "timestamp_precision_accuracy": {"p1": None, "p2": None,
                                   "p3": None}, "loss": None, "comparable_count": 0, "total_count": 1}
    assert r["timestamp_metrics"]["count"] == 2
    assert r["mouse_metrics"]["timestamp_iqmpe"] == pytest.approx(20 / 2250 * 100)


def test_per_event_api_agrees_with_the_collection(codec, tokenizer, vocab):
    rng = np.random.default_rng(8)
    truth = simulate_session(20, seed=4)[:150]
    pred = perturb(truth, rng)
    r = compute_metrics_for_event("".join(map(codec.encode, pred)), "".join(map(codec.encode, truth)))
    metric = OWAEventMetrics(tokenizer, alignment="generation", generated_screens="scored")
    metric.update(torch.tensor([vocab.encode(pred)]), torch.tensor([vocab.encode(truth)]))
    out = metric.compute()
    assert close(out["comparable_rate"], r["comparable_rate"])
    assert close(out["timestamp/iqmpe_pct"], r["timestamp_metrics"]["iqmpe"])
    assert close(out["keyboard/vk_accuracy"], r["keyboard_metrics"]["vk_accuracy"])
    assert close(out["mouse/dx_iqmpe_pct"], r["mouse_metrics"]["dx_iqmpe"])
    assert close(out["mouse/euclidean_precision_p2"], r["mouse_metrics"]["euclidean_precision_accuracy"]["p2"])
    assert close(out["screen/timestamp/precision_p3"], r["screen_metrics"]["timestamp_precision_accuracy"]["p3"])


def test_event_level_metric_classes_match_the_report(tokenizer, vocab):
    from owa_metrics import decode_batch
    from owa_metrics.functional.tokens import event_token_stats
    from owa_metrics.metrics import EventTokenMetrics, EventTypeMetrics

    rng = np.random.default_rng(12)
    seqs = [(perturb(c, rng, change_kinds=False), c) for c in _chunks(simulate_session(20, seed=6), rng, (20, 60))]
    preds, target, _ = _batch_from(vocab, seqs, rng)
    preds = torch.where(target < 0, 0, preds)
    logits = torch.randn(*target.shape, vocab.size)
    report = OWAEventMetrics(tokenizer)
    report.update(preds, target, logits=logits)
    expected = report.compute()
    batch = decode_batch(preds, target, vocab)
    events, tokens = EventTypeMetrics(), EventTokenMetrics()
    events.update(batch)
    tokens.update(event_token_stats(batch, preds, target, vocab.config, logits))
    for metric in (events, tokens):
        for key, value in metric.compute().items():
            if key in GENERATION_ONLY_KEYS:  # the single metric does not know the alignment; the report does
                assert key not in expected, key
                continue
            assert close(value, expected[key]) if key in expected else math.isnan(value), key


# --------------------------------------------------------------------------- exact-mode state size (issue 9)
TENSOR_BYTES = 512  # what one more tensor costs beyond its data (TensorImpl, storage, Python object): ~0.1-0.6 KB


def _state_bytes(state) -> int:
    pieces = state if isinstance(state, list) else [state]
    return sum(t.untyped_storage().nbytes() + TENSOR_BYTES for t in pieces)


def test_exact_state_does_not_grow_per_update_call(tokenizer):
    """10^4 update() calls of one sample cost at most 2x the bytes of one call with all of them (the list
    state is merged as it grows), and the same for the whole report's two sample states; results unchanged."""
    rng = np.random.default_rng(8)
    p, t = (torch.from_numpy(a) for a in rng.integers(1, 500, size=(2, 10_000)))
    one_call, per_sample = SignedPercentError(), SignedPercentError()
    one_call.update(p, t)
    for i in range(p.numel()):
        per_sample.update(p[i:i + 1], t[i:i + 1])
    assert _state_bytes(per_sample.signed_percent_errors) <= 2 * _state_bytes(one_call.signed_percent_errors)
    assert len(per_sample.signed_percent_errors) <= math.log2(p.numel()) + 1
    assert all(close(one_call.compute()[k], v, 1e-12) for k, v in per_sample.compute().items())

    events = [e for e in simulate_session(20, seed=4) if e.kind != "screen"][:200]
    truth = OWAEventMetrics(tokenizer).vocab
    preds, target, _ = _batch_from(truth, [(perturb([e], rng, change_kinds=False), [e]) for e in events], rng)
    preds = preds.clamp(min=0)
    whole, per_event = OWAEventMetrics(tokenizer), OWAEventMetrics(tokenizer)
    whole.update(preds, target)
    for row in range(len(events)):
        per_event.update(preds[row:row + 1], target[row:row + 1])
    for name in ("timestamp_samples", "mouse_samples"):
        assert _state_bytes(getattr(per_event, name)) <= 2 * _state_bytes(getattr(whole, name)), name
    a, b = whole.compute(), per_event.compute()
    assert a.keys() == b.keys() and all(close(a[k], b[k], 1e-12) for k in a)
