"""Generation by time (issue 11): OWAEventMetrics(pairing="time") against the plain-Python oracle."""

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from owa_metrics import Event, OWAEventMetrics, decode_batch
from owa_metrics.decode import greedy_match, unwrap_ns
from owa_metrics.decode.matching import Lanes, lane_table
from owa_metrics.events import read_recording, simulate_session
from conftest import recording_paths
from matching_oracle import greedy, parse_rows, time_oracle, unwrap
from metric_oracle import FORMATS
from oracles import Band, close as in_band

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from count_ops import SyncCounter  # noqa: E402

WINDOW_NS = 16_000_000_000


def close(a, b, tol=1e-9):
    if isinstance(b, Band):  # a bootstrap CI end: within the oracle's Monte-Carlo band
        return in_band(a, b, tol)
    return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)


def jittered(e, rng, max_ms=300):
    return dataclasses.replace(e, timestamp_ns=max(0, e.timestamp_ns + int(rng.integers(-max_ms, max_ms + 1)) * 10**6))


def swapped(e, rng):
    if e.kind == "keyboard":
        return dataclasses.replace(e, vk=(e.vk + int(rng.integers(1, 5))) % 256)
    if e.kind == "mouse":
        return dataclasses.replace(e, button_flags=int(rng.choice([0, 1, 2, 4, 16])))
    return e


def generated(events, rng):
    """Dropped, inserted, duplicated, jittered (+/- 300 ms, so out of order too) and swapped events."""
    out = []
    for e in events:
        if rng.random() < 0.1:
            continue
        g = jittered(e, rng) if rng.random() < 0.5 else e
        out.append(swapped(g, rng) if rng.random() < 0.1 else g)
        if rng.random() < 0.05:
            out.append(jittered(e, rng, 60))
        if rng.random() < 0.05:
            out.append(swapped(jittered(e, rng, 900), rng))
    return out


def garbage(vocab, rng, n):
    return [int(i) for i in rng.integers(0, vocab.size, size=n)]


def pad(rows):
    width = max(max(map(len, rows)), 1)
    return torch.tensor([r + [-100] * (width - len(r)) for r in rows])


def _compare(report, oracle):
    report = {k: float(v) for k, v in report.items()}
    missing = [k for k in oracle if k not in report]
    unknown = [k for k in report if k.startswith("detect/") and k not in oracle]
    assert not missing and not unknown, (missing, unknown)
    bad = {k: (report[k], v) for k, v in oracle.items() if not close(report[k], v)}
    assert not bad, bad


def _recording_batches(vocab, rng):
    """Batches of (generated rows, target rows, origins): recording chunks (some cross the window's wrap) with
    generated sides as above, plus empty and garbage generations and garbage inside a generation."""
    batches = []
    for stretch, path in zip((3, 1, 2), recording_paths()):
        events = read_recording(path, vocab.config.format)  # moved to end 3 s after a window starts, stretched: 2 or 3 wraps crossed
        first = events[0].timestamp_ns
        events = [dataclasses.replace(e, timestamp_ns=1000 * WINDOW_NS - 3 * 10**9 + (e.timestamp_ns - first) * stretch)
                  for e in events]
        bounds = np.cumsum(rng.integers(15, 160, size=len(events)))
        chunks = [events[lo:hi] for lo, hi in zip([0, *bounds], bounds) if lo < len(events)]
        for lo in range(0, len(chunks), 4):
            preds, targets, origins = [], [], []
            for k, chunk in enumerate(chunks[lo:lo + 4]):
                choice = rng.random()
                if choice < 0.08:
                    pred = []
                elif choice < 0.15:
                    pred = garbage(vocab, rng, int(rng.integers(1, 300)))
                else:
                    pred = vocab.encode(generated(chunk, rng))
                    if choice < 0.3:  # a few corrupted tokens: invalid generated events among valid ones
                        at = rng.integers(0, len(pred), size=3)
                        for i in at:
                            pred[i] = int(rng.integers(0, vocab.size))
                preds.append(pred)
                targets.append(vocab.encode(chunk, ignore_images=True))
                first = events.index(chunk[0])
                origins.append(events[first - 1].timestamp_ns % WINDOW_NS if first and k % 2 else -1)
            batches.append((preds, targets, origins))
    return batches


@pytest.mark.parametrize("mode", ["exact", "sketch"])
def test_time_pairing_equals_the_oracle_on_recordings(tokenizer, mode):
    rng = np.random.default_rng(11)
    metric = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", mode=mode, generated_screens="scored",
                             backend="kernel" if mode == "exact" else "torch")  # both greedy_match paths
    vocab = metric.vocab
    batches = _recording_batches(vocab, rng)
    rows = {"preds": [], "targets": [], "origins": []}
    for preds, targets, origins in batches:
        metric.update(pad(preds), pad(targets), origin_ns=torch.tensor(origins))
        rows["preds"] += preds
        rows["targets"] += targets
        rows["origins"] += origins
    report = metric.compute()
    oracle = time_oracle(rows["preds"], rows["targets"], vocab, origins=rows["origins"])
    if mode == "sketch":  # quantiles within the sketch's relative accuracy (tests/test_stats.py); the rest exact
        p50 = oracle.pop("detect/time_error_abs_p50_ms")
        assert abs(float(report.pop("detect/time_error_abs_p50_ms")) - p50) <= 0.005 * p50
        oracle = {k: v for k, v in oracle.items() if not k.endswith(("_ms", "_pct", "_deg"))}
    _compare(report, oracle)
    assert report["count/invalid_pred_events"] > 0 and report["count/extra_events"] > 0
    assert 0 < report["detect/precision"] < 1 and 0 < report["detect/recall"] < 1
    assert report["count/missing_events"] > 0


def test_tolerance_and_default_origin(tokenizer):
    rng = np.random.default_rng(3)
    for tolerance_ms in (0, 400):  # none and wide (100 ms: the test above)
        metric = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", tolerance_ms=tolerance_ms,
                                 generated_screens="scored")
        preds, targets, _ = _recording_batches(metric.vocab, rng)[int(rng.integers(0, 5))]
        metric.update(pad(preds), pad(targets))
        _compare(metric.compute(), time_oracle(preds, targets, metric.vocab, tolerance_ms))


def test_time_pairing_in_each_format(format_vocab):
    """Both token formats (16 s and 10 s windows), origins given for some rows: equal to the oracle."""
    rng = np.random.default_rng(8)
    metric = OWAEventMetrics(vocab=format_vocab, alignment="generation", pairing="time", generated_screens="scored")
    rows = {"preds": [], "targets": [], "origins": []}
    for preds, targets, origins in _recording_batches(format_vocab, rng)[::4]:
        metric.update(pad(preds), pad(targets), origin_ns=torch.tensor(origins))
        for key, part in zip(rows, (preds, targets, origins)):
            rows[key] += part
    _compare(metric.compute(), time_oracle(rows["preds"], rows["targets"], format_vocab, origins=rows["origins"],
                                           fmt=FORMATS[format_vocab.config.format]))


def test_the_origin_decides_which_window_a_first_event_falls_in(tokenizer):
    """Hand-computed (16 s window): targets A at 7 s and 12 s, one generated A at 12 s. From the origin 0 the
    generated event unwraps to 0 + signed(12 s) = -4 s: nothing within 100 ms, precision = recall = 0, 2 missing,
    1 extra. From the default origin (the first target, 7 s) it unwraps to 7 + signed(5 s) = 12 s: one match,
    precision 1, recall 1 / 2."""
    key = dict(kind="keyboard", vk=65, action="press")
    targets = [Event(timestamp_ns=7 * 10**9, **key), Event(timestamp_ns=12 * 10**9, **key)]
    got = {}
    for origin in (0, -1):
        metric = OWAEventMetrics(tokenizer, alignment="generation", pairing="time")
        metric.update(pad([metric.vocab.encode(targets[1:])]), pad([metric.vocab.encode(targets)]),
                      origin_ns=torch.tensor([origin]))
        got[origin] = {k: float(v) for k, v in metric.compute().items()}
    assert got[0]["detect/precision"] == 0 and got[0]["detect/recall"] == 0
    assert got[0]["count/missing_events"] == 2 and got[0]["count/extra_events"] == 1
    assert got[-1]["detect/precision"] == 1 and got[-1]["detect/recall"] == 0.5
    assert got[-1]["count/missing_events"] == 1 and got[-1]["count/extra_events"] == 0
    assert got[-1]["timestamp/abs_error_p95_ms"] == 0


def test_story_one_dropped_event(tokenizer):
    """Drop the first event of a 50-event generation: index pairing measures the shift on the 49 others; time
    pairing keeps 49 perfect pairs and a recall of 49 / 50."""
    events = []
    for e in simulate_session(60, seed=1):  # keyboard and mouse events at least 200 ms apart
        if e.kind != "screen" and (not events or e.timestamp_ns - events[-1].timestamp_ns >= 200_000_000):
            events.append(e)
    events = events[:50]
    assert len(events) == 50
    metric = {p: OWAEventMetrics(tokenizer, alignment="generation", pairing=p) for p in ("index", "time")}
    vocab = metric["time"].vocab
    preds, target = pad([vocab.encode(events[1:])]), pad([vocab.encode(events, ignore_images=True)])
    batches = {p: decode_batch(preds, target, vocab, "generation", pairing=p) for p in metric}
    for p, m in metric.items():
        m.update(batches[p])
    index, time = (metric[p].compute() for p in ("index", "time"))
    perfect = {p: int(((b.status == 0) & (b.pred.values == b.target.values).all(1)).sum()) for p, b in batches.items()}
    assert perfect["time"] == 49 and perfect["index"] < 10
    assert time["count/comparable"] == 49 and time["count/missing_events"] == 1 and time["count/extra_events"] == 0
    assert time["timestamp/abs_error_p95_ms"] == 0 and time["detect/recall"] == 49 / 50
    assert time["detect/precision"] == 1 and time["detect/time_error_abs_p50_ms"] == 0
    assert index["timestamp/abs_error_p95_ms"] > 0


@pytest.mark.filterwarnings("ignore::owa_metrics.metrics.collection.InvalidTargetsWarning")  # random targets
@pytest.mark.parametrize("backend", ["auto", "torch"])  # the compiled scan and the torch ops
def test_random_ids_and_batches_without_generated_events_never_raise(format_vocab, backend):
    """A batch whose generation holds no event span (nothing generated, or random ids) raised IndexError. In the
    defaults, random ids in [-100, V) on either side over seeds and shapes: no exception; every target and generated
    event span counted once (against the string reference), each valid target a detection TP or FN, each generated
    span a TP or FP; with real targets the whole report equal to the oracle."""
    fmt = format_vocab.config.format
    events = simulate_session(20, seed=2, format=fmt)
    checked = set()
    for seed, (B, T) in [(s, shape) for s in range(3) for shape in ((3, 43), (1, 7), (4, 120))]:
        g = torch.Generator().manual_seed(seed)
        random = lambda: torch.randint(-100, format_vocab.size, (B, T), generator=g)  # noqa: E731
        real = pad([format_vocab.encode(events[7 * b + seed:7 * b + seed + 1 + (b + seed) % 4], ignore_images=True)
                    for b in range(B)])
        for case, (preds, target) in {"random": (random(), random()), "random on real": (random(), real),
                                      "nothing on real": (torch.full((B, T), -100), real)}.items():
            metric = OWAEventMetrics(vocab=format_vocab, alignment="generation", pairing="time", backend=backend)
            metric.update(preds, target)
            report = {k: float(v) for k, v in metric.compute().items()}
            scored = metric.scored_ids(preds, target)  # screens are context (the default): left out of both sides
            gen, true = (parse_rows(ids.tolist(), format_vocab) for ids in scored)
            n_gen, n_true = sum(map(len, gen)), sum(map(len, true))
            n_valid = sum(d["status"] == 0 for row in true for d in row)
            assert report["count/target_events"] == n_true and report["count/pred_events"] == n_gen, case
            assert report["count/valid_target_events"] == n_valid, case
            tp, fp, fn = decode_batch(*scored, format_vocab, "generation", backend,
                                      pairing="time").time_matching.detection_counts.sum(1)
            assert tp + fn == n_valid and tp + fp == n_gen, case
            if case != "random":
                oracle = time_oracle(*(ids.tolist() for ids in scored), format_vocab, fmt=FORMATS[fmt])
                _compare(report, {k: v for k, v in oracle.items() if not k.startswith("screen/")})  # none scored
            checked.add((case, n_gen == 0 < n_true))
    assert ("nothing on real", True) in checked and ("random on real", True) in checked


def sequential_greedy(t_key, t_ns, p_key, p_ns, tolerance):
    targets, cands = list(zip(t_ns, t_key)), list(zip(p_ns, p_key))
    found = greedy(targets, cands, tolerance)
    return [found.get(i, -1) for i in range(len(targets))]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_greedy_match_equals_the_sequential_rule(data):
    """Few keys, few distinct times, many ties: deferred acceptance gives the sequential greedy matching."""
    n_t, n_p = data.draw(st.integers(0, 14)), data.draw(st.integers(0, 14))
    keys, times = st.integers(0, 2), st.integers(0, 12)
    t_key, p_key = (data.draw(st.lists(keys, min_size=n, max_size=n)) for n in (n_t, n_p))
    t_ns, p_ns = (data.draw(st.lists(times, min_size=n, max_size=n)) for n in (n_t, n_p))
    tolerance = data.draw(st.integers(0, 5))
    want = sequential_greedy(t_key, t_ns, p_key, p_ns, tolerance)
    for backend in ("kernel", "torch"):  # the compiled scan; deferred acceptance in torch ops
        got = greedy_match(torch.tensor(t_key, dtype=torch.long), torch.tensor(t_ns, dtype=torch.long),
                           torch.tensor(p_key, dtype=torch.long), torch.tensor(p_ns, dtype=torch.long), tolerance,
                           backend)
        assert got.tolist() == want, backend


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_greedy_match_in_row_lanes_equals_the_sequential_rule_without_a_host_sync(data):
    """The torch path with the rows as lanes and their sizes known (what the decoder reads with its event counts):
    no host sync, the sequential greedy matching; the keys hold the row. A huge tolerance ranks the distances."""
    rows = data.draw(st.integers(1, 3))
    side = st.lists(st.tuples(st.integers(0, rows - 1), st.integers(0, 2), st.integers(0, 12)), max_size=12)
    # (row, key, time), in row order; in a row, times in any order
    targets, cands = (sorted(data.draw(side), key=lambda e: e[0]) for _ in range(2))
    tolerance = data.draw(st.sampled_from([0, 1, 2, 5, 2 ** 61]))
    key = lambda events: torch.tensor([r * 10 + k for r, k, _ in events], dtype=torch.long)  # noqa: E731
    ns = lambda events: torch.tensor([a for _, _, a in events], dtype=torch.long)  # noqa: E731
    t_row = torch.tensor([r for r, _, _ in targets], dtype=torch.long)
    depth = max([sum(r == row for r, _, _ in targets) for row in range(rows)])
    width = max([sum(r == row for r, _, _ in cands) for row in range(rows)])
    want = sequential_greedy(key(targets).tolist(), ns(targets).tolist(), key(cands).tolist(), ns(cands).tolist(),
                             tolerance)
    args = key(targets), ns(targets), key(cands), ns(cands)
    with SyncCounter(host_data=True) as syncs:
        lanes = Lanes(lane_table(args[1], t_row, rows, depth), rows, width, tolerance)
        got = greedy_match(*args, tolerance, "torch", lanes)
    assert got.tolist() == want
    assert syncs.total == 0, dict(syncs.calls)


def test_a_chain_of_100_displacements_needs_few_host_reads():
    """Targets at 0, 2, 4, ..., candidates at 1, 3, 5, ..., tolerance 1: by the greedy rule target i takes candidate i
    (candidate i - 1 is taken, the tie goes to the earlier candidate). Deferred acceptance displaces one target a
    round (target i proposes first to candidate i - 1): 100 rounds, whose end is read after 2, 4, 8, ... of them."""
    n = 100
    at, key = torch.arange(n) * 2, torch.zeros(n, dtype=torch.long)
    with SyncCounter() as syncs:
        got = greedy_match(key, at, key, at + 1, 1, "torch")
    assert got.tolist() == list(range(n))
    assert syncs.calls["_local_scalar_dense"] <= 8, dict(syncs.calls)  # 2 + 4 + ... + 64 >= 101 rounds: 6 reads


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, WINDOW_NS - 1), st.booleans()), max_size=12),
       st.integers(0, WINDOW_NS - 1))
def test_unwrap_equals_the_definition(events, origin):
    events.sort(key=lambda e: e[0])
    seq, ts, valid = (torch.tensor([e[i] for e in events], dtype=dtype)
                      for i, dtype in ((0, torch.long), (1, torch.long), (2, torch.bool)))
    got = unwrap_ns(seq, ts, valid, torch.full((3,), origin), WINDOW_NS).tolist()
    for row in range(3):
        at = [i for i, e in enumerate(events) if e[0] == row and e[2]]
        assert [got[i] for i in at] == unwrap([events[i][1] for i in at], origin, WINDOW_NS)


def test_misuse_raises_saying_what_to_do(tokenizer):
    with pytest.raises(ValueError, match="alignment='generation'"):
        OWAEventMetrics(tokenizer, pairing="time")
    with pytest.raises(ValueError, match="pairing must be"):
        OWAEventMetrics(tokenizer, alignment="generation", pairing="nearest")
    for bad in (-1, 8000, float("nan"), "100"):
        with pytest.raises(ValueError, match="tolerance_ms"):
            OWAEventMetrics(tokenizer, alignment="generation", pairing="time", tolerance_ms=bad)
    metric = OWAEventMetrics(tokenizer, alignment="generation")
    ids = pad([[1, 2, 3]])
    with pytest.raises(ValueError, match="pairing='time'"):
        metric.update(ids, ids, origin_ns=0)
    with pytest.raises(ValueError, match="paired by time"):
        metric.update(decode_batch(ids, ids, metric.vocab, "generation", pairing="time"))
    with pytest.raises(ValueError, match="origin_ns"):
        decode_batch(ids, ids, metric.vocab, "generation", pairing="time", origin_ns=torch.zeros(3))


def test_the_hf_adapter_refuses_time_pairing(tokenizer):
    from owa_metrics.callbacks import OWAEventMetricsForTrainer

    with pytest.raises(ValueError, match="teacher-forced logits"):
        OWAEventMetricsForTrainer(tokenizer, alignment="generation", pairing="time")
