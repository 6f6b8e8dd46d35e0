"""The extension point: a metric declared here, in a test file, joins the report of every `OWAEventMetrics` built
after `register`, on both accumulation paths, in both modes, and syncs under torch.distributed (gloo, 2 processes),
with no change anywhere else. The oracle: plain Python over the event pairs."""

import json
import os
import socket
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer
from owa_metrics.events import simulate_session
from owa_metrics.functional.declare import ONE, Definition, Samples, Sums, error
from owa_metrics.functional.events import ratio
from owa_metrics.functional.report import register, unregister
from metric_oracle import perturb
from oracles import normalized

# the toy metric: the mean |dx error| of the comparable mouse events, and how many there are
TOY = Definition(
    "toy_dx",
    lambda shape: {"toy_dx": Sums(("comparable_mouse",), {"abs_dx_error": abs(error("dx")), "events": ONE})},
    lambda r: {"mouse/toy_dx_abs_error_mean": ratio(r["toy_dx"].abs_dx_error, r["toy_dx"].events),
               "count/toy_mouse_events": r["toy_dx"].events})


# a sampled one: the median |dy error| of the comparable mouse events (a third `Samples` state: the report's two
# sampled rows' numbers are then read apart, not packed)
TOY_SAMPLES = Definition(
    "toy_dy",
    lambda shape: {"toy_dy": Samples("comparable_mouse", {"abs_dy_error": abs(error("dy"))})},
    lambda r: {"mouse/toy_dy_abs_error_p50": r.samples("toy_dy", "abs_dy_error").quantile(0.5)})


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    unregister(TOY.name)


def _shards(vocab):
    """Two uneven shards of (preds, target) batches and the event pairs they hold: predictions that keep every
    event's kind (so the k-th predicted event is paired with the k-th true one, comparable)."""
    rng = np.random.default_rng(3)
    events = simulate_session(60, seed=8)
    chunks = [events[i:i + 30] for i in range(0, len(events), 30)]
    pairs, shards = [], [[], []]
    for k, lo in enumerate(range(0, len(chunks), 3)):
        group = chunks[lo:lo + 3]
        preds = [perturb(c, rng, change_kinds=False) for c in group]
        pairs += [(normalized(p), normalized(t)) for pc, tc in zip(preds, group) for p, t in zip(pc, tc)]
        p_ids, t_ids = [vocab.encode(c) for c in preds], [vocab.encode(c, ignore_images=True) for c in group]
        width = max(map(len, p_ids + t_ids))
        pad = lambda rows: torch.tensor([r + [-100] * (width - len(r)) for r in rows])  # noqa: E731
        shards[0 if k % 3 else 1].append((pad(p_ids), pad(t_ids)))  # rank 0 gets two batches in three
    return shards, pairs


def _oracle(pairs):
    mouse = [(p, t) for p, t in pairs if t.kind == "mouse" and p.kind == "mouse"]
    return sum(abs(p.dx - t.dx) for p, t in mouse) / len(mouse), len(mouse)


@pytest.mark.parametrize("backend", ["kernel", "torch"])
@pytest.mark.parametrize("mode", ["exact", "sketch"])
def test_a_declared_metric_joins_the_report(toy, tokenizer, backend, mode):
    metric = OWAEventMetrics(tokenizer, alignment="generation", backend=backend, mode=mode)
    shards, pairs = _shards(metric.vocab)
    for preds, target in shards[0] + shards[1]:
        metric.update(preds, target)
    report = metric.compute()
    mean, n = _oracle(pairs)
    assert n > 100 and mean > 0
    assert report["count/toy_mouse_events"] == n
    assert abs(float(report["mouse/toy_dx_abs_error_mean"]) - mean) <= 1e-12 * mean
    assert "keyboard/accuracy" in report  # the rest of the report is there too


@pytest.mark.parametrize("backend", ["kernel", "torch"])
@pytest.mark.parametrize("mode", ["exact", "sketch"])
def test_a_declared_sampled_metric_joins_the_report(tokenizer, backend, mode):
    register(TOY_SAMPLES)
    try:
        metric = OWAEventMetrics(tokenizer, alignment="generation", backend=backend, mode=mode)
    finally:
        unregister(TOY_SAMPLES.name)
    plain = OWAEventMetrics(tokenizer, alignment="generation", backend=backend, mode=mode)
    shards, pairs = _shards(metric.vocab)
    for preds, target in shards[0] + shards[1]:
        metric.update(preds, target)
        plain.update(preds, target)
    report, without = metric.compute(), plain.compute()
    assert set(report) - set(without) == {"mouse/toy_dy_abs_error_p50"}
    assert all(float(report[k]) == float(v) for k, v in without.items())  # the rest of the report unchanged
    want = np.median([abs(p.dy - t.dy) for p, t in pairs if t.kind == "mouse" and p.kind == "mouse"])
    tolerance = 1e-12 if mode == "exact" else 0.005 * want + 1e-4  # the sketch: within its relative accuracy
    assert want > 0 and abs(float(report["mouse/toy_dy_abs_error_p50"]) - want) <= tolerance
    assert "mouse/direction_error_p50_deg" in report and "timestamp/iqmpe_pct" in report  # the others' samples


def test_unregistered_it_is_gone(tokenizer):
    assert "mouse/toy_dx_abs_error_mean" not in OWAEventMetrics(tokenizer).compute()


def _worker(rank, world, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    register(TOY)  # each process declares it, as a user's module would on import
    tokenizer = build_tokenizer()
    metric = OWAEventMetrics(tokenizer, alignment="generation")
    shards, _ = _shards(VocabMap.from_tokenizer(tokenizer))
    for preds, target in shards[rank]:
        metric.update(preds, target)
    report = {k: v.item() for k, v in metric.compute().items()}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


def test_a_declared_metric_syncs_under_ddp(toy, tmp_path, tokenizer):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "synced.json"
    mp.spawn(_worker, args=(2, port, str(out)), nprocs=2, join=True)
    synced = json.loads(out.read_text())
    _, pairs = _shards(VocabMap.from_tokenizer(tokenizer))
    mean, n = _oracle(pairs)
    assert synced["count/toy_mouse_events"] == n
    assert abs(synced["mouse/toy_dx_abs_error_mean"] - mean) <= 1e-12 * mean
