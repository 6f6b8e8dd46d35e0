"""Synced compute() under torch.distributed (gloo, CPU processes) equals the one-process result."""

import dataclasses
import json
import os
import socket
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchmetrics.utilities.distributed import gather_all_tensors

from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer
from owa_metrics.evaluate import evaluate, write_sequences
from owa_metrics.metrics import base
from owa_metrics.events import simulate_session
from metric_oracle import perturb


def _batches(vocab):
    """Shards (one list of (preds, target) batches per rank, for 3 ranks), all generated from one seed."""
    rng = np.random.default_rng(0)
    events = simulate_session(90, seed=5)

    def batch(chunks):
        preds = [vocab.encode(perturb(c, rng)) for c in chunks]
        target = [vocab.encode(c, ignore_images=True) for c in chunks]
        width = max(map(len, preds + target)) if chunks else 1
        pad = lambda rows: torch.tensor([r + [-100] * (width - len(r)) for r in rows] or [[-100] * width])  # noqa: E731
        return pad(preds), pad(target)

    chunks = [events[i:i + 40] for i in range(0, len(events), 40)]
    keyboard_only = [[e for e in c if e.kind == "keyboard"] for c in chunks[:6]]
    return [
        [batch(chunks[0:3]), batch(chunks[3:4]), batch(chunks[4:9]), batch(chunks[9:])],  # rank 0: four updates
        [batch([]), batch(keyboard_only[:2]), batch(keyboard_only[2:])],  # rank 1: an empty batch, no mouse events
        [batch(keyboard_only[:1])],  # rank 2: a single update
    ]


def _worker(rank, port, out_dir):
    """One set of processes for both process counts (process start-up is most of the cost): all three ranks in a
    world of 3, then a fresh default process group of ranks 0 and 1 (world 2) at the same address (as a notebook or a
    sweep sets up one after the other); rank 0 writes ``synced_{world}.json``."""
    torch.set_num_threads(1)
    for world in (3, 2):
        if rank >= world:
            break
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))  # a hang fails
        results = _synced(rank, world)
        # evaluate() in each group: the second one's store is a new one at the same address (issue 43 item 10)
        results["evaluate"] = evaluate(*(os.path.join(out_dir, name) for name in ("pred.txt", "true.txt")),
                                       progress=False)
        if rank == 0:
            with open(os.path.join(out_dir, f"synced_{world}.json"), "w") as f:
                json.dump(results, f)
        dist.barrier()
        dist.destroy_process_group()
        closed = os.path.join(out_dir, f"closed_{world}")  # rank 0's store is gone: no rank reaches it for the next
        if rank == 0:
            open(closed, "w").close()
        for _ in range(600):
            if os.path.exists(closed):
                break
            time.sleep(0.1)


def _synced(rank, world):
    """This rank's share of every check, computed under the initialized process group of ``world`` ranks."""
    tokenizer = build_tokenizer()
    shards = _batches(VocabMap.from_tokenizer(tokenizer))
    if world == 2:
        shards = [shards[0], shards[1] + shards[2]]
    results, results["torchmetrics_sync"] = {}, {}
    for mode in ("exact", "sketch"):
        metric = OWAEventMetrics(tokenizer, alignment="generation", mode=mode, **D2E)
        for preds, target in shards[rank]:
            metric.update(preds, target)
        results["torchmetrics_sync"][mode] = _against_torchmetrics_sync(metric)
        results[mode] = {"report": {k: v.item() for k, v in metric.compute().items()},
                         "confusion": metric.confusion_matrix().tolist()}
    metric = OWAEventMetrics(tokenizer, alignment="generation", pairing="time")  # detection counts and samples
    for preds, target in shards[rank]:
        metric.update(preds, target)
    base.SYNC_HEAD, head = 2, base.SYNC_HEAD  # more cat states (5) than travel with the fingerprint: a second gather
    results["torchmetrics_sync"]["time"] = _against_torchmetrics_sync(metric)
    results["time"] = {"report": {k: v.item() for k, v in metric.compute().items()}, "confusion": []}
    base.SYNC_HEAD = head
    results["different_settings"] = _different_settings(tokenizer, shards[rank], world)
    metric = OWAEventMetrics(tokenizer, alignment="generation", tags=TAGS[:2 + rank])  # the ranks' tags differ
    metric.update(*shards[rank][0], tags=torch.zeros(len(shards[rank][0][1]), dtype=torch.int64))
    try:
        metric.compute()
        results["different_tags"] = "no error"
    except ValueError as err:
        results["different_tags"] = str(err)
    for mode in ("exact", "sketch"):  # slices: every key of every tag (two tags live on rank 0 only, one nowhere)
        results[f"tags_{mode}"] = {"report": _tagged(tokenizer, mode, shards[rank]), "confusion": []}
    if world == 2:  # compute() mid-epoch on every rank, then updates on rank 0 only, then compute() again
        metric = OWAEventMetrics(tokenizer, alignment="generation")
        for preds, target in shards[rank][:MID_EPOCH[rank]]:
            metric.update(preds, target)
        metric.compute()
        if rank == 0:
            metric.update(*shards[0][MID_EPOCH[0]])
        answers = [None] * world
        dist.all_gather_object(answers, {k: v.item() for k, v in metric.compute().items()})
        results["mid_epoch"] = answers
        results.update(_shared_compute(tokenizer, shards[rank], rank, world))
    return results


# issue 43 items 3 and 4: rank 0's argument, the other ranks' (the same state sizes, or other ones)
DIFFERENT = {"tags": ({"tags": ["minecraft", "vscode"]}, {"tags": ["chrome", "vscode"]}),
             "bin_ms": ({"bin_ms": 50}, {"bin_ms": 100}),
             "mode": ({"mode": "exact"}, {"mode": "sketch"}),
             "pairing": ({"pairing": "time"}, {})}


def _different_settings(tokenizer, batches, world):
    """For each `DIFFERENT` case, what compute() raised on each rank (every rank's, in rank order)."""
    rank, out = dist.get_rank(), {}
    for name, kwargs in DIFFERENT.items():
        metric = OWAEventMetrics(tokenizer, alignment="generation", **kwargs[min(rank, 1)])
        for preds, target in batches:
            metric.update(preds, target, **({"tags": torch.zeros(len(target), dtype=torch.int64)} if "tags" in
                                            kwargs[0] else {}))
        try:
            metric.compute()
            said = "no error"
        except ValueError as err:
            said = f"ValueError: {err}"
        out[name] = [None] * world
        dist.all_gather_object(out[name], said)
    return out


def _shared_compute(tokenizer, batches, rank, world):
    """compute() that syncs shares the report's work: the definitions each rank computed (a name per (scope,
    definition) pair, recorded by wrapping the definitions' compute) and its report, a definition that fails on the
    rank computing it (every rank raises), and ``sync_on_compute=False``: rank 0 alone computes, its own states and
    then synced ones."""
    metric = OWAEventMetrics(tokenizer, alignment="generation", tags=TAGS[:2], tag_keys="all")
    computed = []

    def counted(definition):
        def compute(read):
            computed.append(definition.name)
            return definition.compute(read)
        return dataclasses.replace(definition, compute=compute)

    def failing(definition):  # the pooled keys only
        return dataclasses.replace(definition, compute=lambda read: 1 / 0 if read.tag is None else definition.compute(read))

    metric.definitions = tuple(counted(d) for d in metric.definitions)
    for preds, target in batches:
        metric.update(preds, target, tags=torch.arange(len(target)) % 2)
    report = {k: v.item() for k, v in metric.compute().items()}
    out = {"shared": [None] * world, "failed": [None] * world}
    dist.all_gather_object(out["shared"], (sorted(computed), report))
    metric.definitions = tuple(failing(d) if d.name == "mouse" else d for d in metric.definitions)
    try:
        metric.compute()
        said = "no error"
    except (ZeroDivisionError, RuntimeError) as err:
        said = f"{type(err).__name__}: {err}"
    dist.all_gather_object(out["failed"], said)
    local = OWAEventMetrics(tokenizer, alignment="generation", sync_on_compute=False)
    for preds, target in batches:
        local.update(preds, target)
    if rank == 0:  # the others do not call compute(): no collective in it
        out["local"] = {k: v.item() for k, v in local.compute().items()}
    local.sync()
    if rank == 0:
        out["synced_local"] = {k: v.item() for k, v in local.compute().items()}
    dist.barrier()
    return out


def _check_shared_compute(synced, tokenizer, shards):
    """`_shared_compute` on 2 ranks against one process."""
    def one(batches, **kwargs):
        metric = OWAEventMetrics(tokenizer, alignment="generation", **kwargs)
        for preds, target in batches:
            metric.update(preds, target, **({"tags": torch.arange(len(target)) % 2} if "tags" in kwargs else {}))
        return {k: v.item() for k, v in metric.compute().items()}, [d.name for d in metric.definitions]

    def same(got, want):
        assert got.keys() == want.keys()
        assert not _bits_differ(got, want)

    everything = shards[0] + shards[1] + shards[2]
    want, names = one(everything, tags=TAGS[:2], tag_keys="all")
    (first, report0), (second, report1) = synced["shared"]
    assert report0 == report1  # the same floats on every rank, whichever rank computed them
    same(report0, want)
    assert sorted(first + second) == sorted(names * 3)  # every (scope, definition) once: pooled and two tags
    assert first and second  # both ranks computed a share
    failed = sorted(synced["failed"])  # the pooled mouse keys fail on the rank that computes them: both raise
    assert failed[0].startswith("RuntimeError: OWAEventMetrics.compute() failed on rank ") and "ZeroDivision" in failed[0]
    assert failed[1].startswith("ZeroDivisionError"), failed
    same(synced["local"], one(shards[0])[0])  # sync_on_compute=False: rank 0's own states, the others idle
    same(synced["synced_local"], one(everything)[0])  # synced by hand, then computed on rank 0 alone


def _bits_differ(got: dict, want: dict) -> dict:
    """The keys of ``want`` whose value in ``got`` is not the same float bit for bit, with both values."""
    return {k: (got[k], v) for k, v in want.items() if float(got[k]).hex() != float(v).hex()}


TAGS = ["even", "odd", "even_big", "odd_big", "never"]


def _against_torchmetrics_sync(metric):
    """[states compared, those whose synced value differs]: the metric's own sync (`Float64Metric._sync_dist`)
    against torchmetrics' (what a ``dist_sync_fn`` other than its default gets), bit for bit, shape and dtype."""
    synced = []
    for fn in (None, lambda tensor, group=None: gather_all_tensors(tensor, group)):
        metric.sync(dist_sync_fn=fn)
        synced.append({name: getattr(metric, name).clone() for name in metric._defaults})
        metric.unsync()
    ours, theirs = synced
    bits = lambda x: x.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731  (NaN samples: equal bits)
    return [len(ours), [name for name in ours if (ours[name].dtype, ours[name].shape) != (theirs[name].dtype,
                        theirs[name].shape) or not torch.equal(bits(ours[name]), bits(theirs[name]))]]


def _tagged(tokenizer, mode, batches):
    """Tags by row: even / odd, the rows of batches of 5 or more sequences (rank 0's only) ``_big``; none "never"."""
    metric = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", mode=mode, tags=TAGS, tag_keys="all")
    for preds, target in batches:
        metric.update(preds, target, tags=torch.arange(len(target)) % 2 + 2 * (len(target) >= 5))
    return {k: v.item() for k, v in metric.compute().items()}


D2E = {"bin_ms": 50, "bin_shifts": (-2, 1)}  # issue 31's binned keys: their sums sync like the others
MID_EPOCH = (2, 1)  # batches each rank updates before the mid-epoch compute (2 ranks); rank 0 then adds one more


def _free_ports(n):
    """``n`` distinct free ports (the sockets are held open together while the ports are chosen)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in sockets)
    finally:
        for s in sockets:
            s.close()


def _single_process(mode, pairing="index"):
    tokenizer = build_tokenizer()
    metric = OWAEventMetrics(tokenizer, alignment="generation", mode=mode, pairing=pairing,
                             **(D2E if pairing == "index" else {}))
    for shard in _batches(VocabMap.from_tokenizer(tokenizer)):
        for preds, target in shard:
            metric.update(preds, target)
    return {k: v.item() for k, v in metric.compute().items()}, [] if pairing == "time" else metric.confusion_matrix().tolist()


def _files(out):
    """The shards' sequences as the two text files `evaluate` reads (predictions, truths)."""
    tokenizer = build_tokenizer()
    batches = [b for shard in _batches(VocabMap.from_tokenizer(tokenizer)) for b in shard]
    for name, side in (("pred.txt", 0), ("true.txt", 1)):
        write_sequences(out / name, [row for batch in batches for row in batch[side].tolist()], tokenizer)
    return out / "pred.txt", out / "true.txt"


@pytest.fixture(scope="module")
def synced_by_world(tmp_path_factory):
    """Each process count's synced results, from one launch of 3 processes (`_worker`), and the one-process report
    of `evaluate` on the files the processes read."""
    out = tmp_path_factory.mktemp("synced")
    files = _files(out)
    mp.spawn(_worker, args=(_free_ports(1)[0], str(out)), nprocs=3, join=True)
    synced = {world: json.loads((out / f"synced_{world}.json").read_text()) for world in (2, 3)}
    return synced, evaluate(*files, progress=False)


@pytest.fixture(scope="module")
def expected():
    """The one-process results (the oracle both process counts are compared with), computed once."""
    expected = {mode: _single_process(mode) for mode in ("exact", "sketch")}
    expected["time"] = _single_process("exact", "time")
    tokenizer = build_tokenizer()
    for mode in ("exact", "sketch"):
        expected[f"tags_{mode}"] = _tagged(tokenizer, mode, [b for shard in _batches(VocabMap.from_tokenizer(tokenizer))
                                                             for b in shard])
    return expected


@pytest.mark.parametrize("world", [2, 3])
def test_synced_compute_equals_one_process(synced_by_world, expected, world):
    synced = synced_by_world[0][world]
    assert expected["time"][0]["detect/f1"] < 1 and "detect/time_error_abs_p50_ms" in expected["time"][0]
    for mode in ("exact", "sketch", "time"):  # issue 26's keys: samples, sketches and sums, synced like the others
        assert expected[mode][0]["count/click_events"] > 0 and "mouse/click_offset_p95_mu" in expected[mode][0]
        assert "mouse/path_end_offset_p50_mu" in expected[mode][0] and "keyboard/sequence_error_rate" in expected[mode][0]
    assert 0 < expected["time"][0]["mouse/move_coverage"] < 1
    for key in ("d2e/keyboard/key_accuracy", "d2e/mouse_move/pearson_x_shift_-2bins", "d2e/best_shift_bins",
                "d2e/keyboard/strict_accuracy", "d2e/keyboard/false_positive_rate_shift_1bins",
                "d2e/mouse_move/pearson_x_all_bins", "d2e/mouse_move/pearson_y_all_bins_shift_1bins"):  # issue 46's too
        assert key in expected["exact"][0] and key in expected["sketch"][0]
    for mode, (compared, differ) in synced["torchmetrics_sync"].items():  # rank 0's synced states
        assert compared >= 20 and not differ, (mode, differ)
    assert "different shapes" in synced["different_tags"], synced["different_tags"]
    assert "tags ['even', 'odd'] on rank 0 but ['even', 'odd', 'even_big'] on rank 1" in synced["different_tags"]
    for name, said in synced["different_settings"].items():  # the same ValueError on every rank, naming the argument
        assert len(said) == world and len(set(said)) == 1, (name, said)
        assert said[0].startswith("ValueError: OWAEventMetrics: the ranks' metrics were built with different "
                                  "arguments"), said[0]
        assert said[0].endswith("construct the metric with the same arguments on every rank"), said[0]
    different = {name: said[0] for name, said in synced["different_settings"].items()}
    assert "tags ['minecraft', 'vscode'] on rank 0 but ['chrome', 'vscode'] on rank 1" in different["tags"]
    assert "hold different things" in different["tags"]  # the same sizes: summed, they would be a wrong report
    assert "bin_ms 50.0 on rank 0 but 100.0 on rank 1" in different["bin_ms"]
    assert "mode 'exact' on rank 0 but 'sketch' on rank 1" in different["mode"]
    assert "pairing 'time' on rank 0 but 'index' on rank 1" in different["pairing"]
    assert synced["evaluate"] == pytest.approx(synced_by_world[1], rel=1e-12, abs=1e-12)  # a second group, too
    assert synced_by_world[1]["count/target_events"] == expected["exact"][0]["count/target_events"]
    for mode in ("exact", "sketch", "time"):
        got = synced[mode]
        report, confusion = expected[mode]
        assert got["confusion"] == confusion
        assert got["report"].keys() == report.keys()
        # exact mode: the same values; sketch mode: the same bucket sums, so the same result too
        differ = _bits_differ(got["report"], report)
        assert not differ, (mode, differ)
    if world == 2:
        tokenizer = build_tokenizer()
        shards = _batches(VocabMap.from_tokenizer(tokenizer))
        metric = OWAEventMetrics(tokenizer, alignment="generation")
        for preds, target in shards[0][:MID_EPOCH[0] + 1] + (shards[1] + shards[2])[:MID_EPOCH[1]]:
            metric.update(preds, target)
        one = {k: v.item() for k, v in metric.compute().items()}
        for answer in synced["mid_epoch"]:  # the same answer on both ranks: no stale cache on the idle one
            assert answer.keys() == one.keys() and not _bits_differ(answer, one)
        _check_shared_compute(synced, tokenizer, shards)
    for mode in ("exact", "sketch"):
        one = expected[f"tags_{mode}"]
        got = synced[f"tags_{mode}"]["report"]
        assert got.keys() == one.keys() and {k.split("/")[1] for k in one if k.startswith("tag/")} == set(TAGS[:4])
        differ = _bits_differ(got, one)
        assert not differ, (mode, differ)
        assert one["tag/even_big/detect/f1"] < 1 and one["tag/odd/count/sequences"] > 0
    exact, sketch = expected["exact"][0], expected["sketch"][0]
    for key in ("timestamp/abs_error_p95_ms", "mouse/direction_error_p95_deg", "mouse/euclidean_pe_p95_pct"):
        assert abs(sketch[key] - exact[key]) <= 0.005 * abs(exact[key]) + 1e-9, key


@pytest.mark.parametrize("pairing", ["index", "time"])
def test_update_order_and_merge_state_keep_every_bit(expected, pairing):
    """Issue 44: every key the same float bit for bit (sums of means and cosines among them) when the batches come
    in the reverse order, and from two metrics' ``merge_state`` (the 2 ranks' shards), as from one process."""
    tokenizer = build_tokenizer()
    shards = _batches(VocabMap.from_tokenizer(tokenizer))
    batches = [b for shard in shards for b in shard]

    def metric(updates):
        out = OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing, **(D2E if pairing == "index" else {}))
        for preds, target in updates:
            out.update(preds, target)
        return out

    one = expected["exact" if pairing == "index" else "time"][0]
    assert "comparable_rate_seq_macro" in one and "keyboard/accuracy_seq_macro" in one
    assert pairing == "index" or "mouse/cosine_with_misses" in one
    reverse = {k: v.item() for k, v in metric(batches[::-1]).compute().items()}
    assert reverse.keys() == one.keys() and not _bits_differ(reverse, one), _bits_differ(reverse, one)
    merged = metric(shards[0])
    merged.merge_state(metric(shards[1] + shards[2]))
    merged = {k: v.item() for k, v in merged.compute().items()}
    assert merged.keys() == one.keys() and not _bits_differ(merged, one), _bits_differ(merged, one)


def test_teacher_forcing_keeps_every_bit_in_another_order_of_batches():
    """Issue 44: teacher forcing with random timestamp digits (errors of seconds: sums of squared ns would pass 2^53
    and round) over 12 batches: every key (timestamp R² among them) the same float bit for bit when the batches come
    in the reverse order, and from two metrics' ``merge_state``."""
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    rows = vocab.encode_sequences(simulate_session(300.0, seed=7), 256, ignore_images=True)[:48]
    labels = torch.tensor([r[:min(map(len, rows))] for r in rows])
    digits = torch.tensor([vocab.ids[f"<{i}>"] for i in range(10)])
    preds = labels.clone()
    wrong = torch.isin(labels, digits)
    preds[wrong] = digits[torch.randint(0, 10, (int(wrong.sum()),), generator=torch.Generator().manual_seed(0))]
    batches = [(preds[i:i + 4], labels[i:i + 4]) for i in range(0, len(labels), 4)]

    def report(*parts):
        metrics = [OWAEventMetrics(tokenizer) for _ in parts]
        for metric, part in zip(metrics, parts):
            for p, t in part:
                metric.update(p, t)
        for other in metrics[1:]:
            metrics[0].merge_state(other)
        return {k: v.item() for k, v in metrics[0].compute().items()}

    one = report(batches)
    assert "timestamp/r2" in one and "keyboard/accuracy_seq_macro" in one and one["timestamp/abs_error_p95_ms"] > 1000
    for got in (report(batches[::-1]), report(batches[5:], batches[:5])):
        assert got.keys() == one.keys() and not _bits_differ(got, one), _bits_differ(got, one)


def test_deal_gives_the_costliest_first_to_the_least_loaded_rank():
    """By hand: a (5) to rank 0; b (3) to rank 1; c (3) to rank 1 (3 < 5); d (1) to rank 0 (5 < 6); ties to the
    lowest rank."""
    from owa_metrics.metrics.shared_compute import deal

    assert deal(["a", "b", "c", "d"], [5, 3, 3, 1], 2) == [["a", "d"], ["b", "c"]]
    assert deal(["a", "b", "c"], [0, 0, 0], 2) == [["a", "b", "c"], []]  # free items: all to the lowest rank
    assert deal(["a", "b"], [1, 2], 1) == [["a", "b"]]
