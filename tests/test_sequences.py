"""What a generated sequence does (issue 26): cursor path offsets, key-sequence error rate, movement with its misses,
against the plain-Python oracle written from the issue (`sequence_oracle`) and hand-computed cases."""

import numpy as np
import pytest
import torch

from owa_metrics import Event, OWAEventMetrics, decode_batch
from owa_metrics.functional.sequences import levenshtein, levenshtein_torch
from metric_oracle import FORMATS
from sequence_oracle import levenshtein as oracle_levenshtein, sequence_oracle
from test_pairing import _recording_batches, pad

MS = 1_000_000
NEW = ("mouse/click_offset", "mouse/path_end_offset", "keyboard/sequence_", "_with_misses", "mouse/move_coverage",
       "count/click_events", "count/path_rows", "count/keyboard_sequence_rows", "count/move_events")
QUANTILES = ("mouse/click_offset_p50_mu", "mouse/click_offset_p95_mu", "mouse/path_end_offset_p50_mu")


def _report(metric):
    return {k: float(v) for k, v in metric.compute().items() if any(n in k for n in NEW)}


def _assert_equal(report, oracle, sketch=False):
    assert set(report) == set(oracle), set(report) ^ set(oracle)
    for key, want in oracle.items():
        # the sketch: each order statistic within its relative accuracy (0.5 %), and so their interpolation
        tol = 0.005 * abs(want) + 1e-9 if sketch and key in QUANTILES else 1e-9 * max(1.0, abs(want))
        assert abs(report[key] - want) <= tol, (key, report[key], want)


def _events(rows):
    return [Event(kind=k, timestamp_ns=t * MS, **fields) for k, t, fields in rows]


def _run(tokenizer, pairing, generated, true, mode="exact", backend="auto"):
    metric = OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing, mode=mode, backend=backend)
    v = metric.vocab
    metric.update(pad([v.encode(g) for g in generated]), pad([v.encode(t, ignore_images=True) for t in true]))
    return {k: float(x) for k, x in metric.compute().items()}


def test_hand_computed_cases(tokenizer):
    """A click after three moves of (10, 0), generated as three of (10, 1): offset |(30, 3) - (30, 0)| = 3.
    "abc" typed as "abd" (press and release each): 2 substitutions / 6 keys. Moves (10, 0) and (0, 10), only the
    first generated: coverage 1 / 2, cosine (1 + 0) / 2, R² = 1 - 100 / 100 = 0."""
    moves = lambda dy: [("mouse", 100 + 50 * i, dict(dx=10, dy=dy)) for i in range(3)]  # noqa: E731
    click = [("mouse", 300, dict(dx=0, dy=0, button_flags=0x001))]
    typed = lambda word: _events([("keyboard", 100 + 40 * i + 20 * a, dict(vk=ord(c), action=("press", "release")[a]))  # noqa: E731
                                  for i, c in enumerate(word) for a in (0, 1)])
    true_moves = _events([("mouse", 100, dict(dx=10, dy=0)), ("mouse", 600, dict(dx=0, dy=10))])
    for pairing in ("index", "time"):
        for mode, backend in (("exact", "kernel"), ("sketch", "torch")):
            got = _run(tokenizer, pairing, [_events(moves(1) + click), typed("abd")],
                       [_events(moves(0) + click), typed("abc")], mode, backend)
            tol = 0.005 * 3 if mode == "sketch" else 1e-12
            for key in QUANTILES:
                assert abs(got[key] - 3) <= tol, (pairing, mode, key, got[key])
            assert got["count/click_events"] == 1 and got["count/path_rows"] == 1
            assert got["keyboard/sequence_error_rate"] == 2 / 6 and got["keyboard/sequence_exact_rate"] == 0
            assert got["count/keyboard_sequence_rows"] == 1
    got = _run(tokenizer, "time", [true_moves[:1]], [true_moves])
    assert got["mouse/move_coverage"] == 0.5 and got["count/move_events"] == 2
    assert got["mouse/cosine_with_misses"] == 0.5 and abs(got["mouse/r2_with_misses"]) <= 1e-12
    assert "mouse/move_coverage" not in _run(tokenizer, "index", [true_moves[:1]], [true_moves])  # time pairing only


@pytest.fixture(scope="module")
def recording_rows(format_vocab):
    """The recordings as targets (a few true tokens corrupted), generated sides that drop, insert, jitter (out of
    order too) and swap events, garbage and empty generations (tests/test_pairing.py), some rows with an origin; and
    the oracle's keys."""
    rows = {"preds": [], "targets": [], "origins": []}
    rng = np.random.default_rng(26)
    for preds, targets, origins in _recording_batches(format_vocab, rng):
        for target in targets[::3]:  # a few corrupted true tokens: invalid true events among valid ones
            for i in rng.integers(0, len(target), size=2):
                target[i] = int(rng.integers(0, format_vocab.size))
        for key, part in zip(rows, (preds, targets, origins)):
            rows[key].append(part)
    flat = {k: [x for part in v for x in part] for k, v in rows.items()}
    oracle = sequence_oracle(flat["preds"], flat["targets"], format_vocab, flat["origins"],
                             FORMATS[format_vocab.config.format])
    return rows, oracle


@pytest.mark.parametrize("pairing", ["index", "time"])
def test_each_key_equals_the_oracle_on_recordings(recording_rows, format_vocab, pairing):
    rows, oracle = recording_rows
    metrics = {(mode, backend): OWAEventMetrics(vocab=format_vocab, alignment="generation", pairing=pairing,
                                                mode=mode, backend=backend, generated_screens="scored")
               for mode, backend in (("exact", "kernel"), ("exact", "torch"), ("sketch", "auto"))}
    for preds, targets, origins in zip(rows["preds"], rows["targets"], rows["origins"]):
        for metric in metrics.values():
            metric.update(pad(preds), pad(targets), origin_ns=torch.tensor(origins) if pairing == "time" else None)
    want = oracle[pairing]
    assert want["count/click_events"] >= 5 and want["count/path_rows"] > 10 and want["mouse/click_offset_p95_mu"] > 0
    assert 0 < want["keyboard/sequence_error_rate"] and 0 < want["keyboard/sequence_exact_rate"] < 1
    if pairing == "time":
        assert 0 < want["mouse/move_coverage"] < 1 and want["mouse/r2_with_misses"] < 1
    for (mode, _), metric in metrics.items():
        assert metric.compute()["status/invalid_target"] > 0  # the case is there: invalid true events
        _assert_equal(_report(metric), want, sketch=mode == "sketch")


def test_levenshtein_bit_parallel_and_torch_equal_the_textbook_recurrence():
    rng = np.random.default_rng(5)
    B = 40
    sides = []
    for long in ((150, 70), (130, 90)):  # rows of 0..12 codes from a small alphabet, some entries not codes (-1)
        lengths = rng.integers(0, 13, size=B)
        lengths[:2] = long  # and two rows longer than a machine word (the bit-parallel blocks)
        rows = np.repeat(np.arange(B), lengths)
        codes = np.where(rng.random(len(rows)) < 0.15, -1, rng.integers(0, 4, size=len(rows)))
        sides += [torch.from_numpy(codes), torch.from_numpy(rows)]
    want = [oracle_levenshtein([int(c) for c, r in zip(sides[0], sides[1]) if r == b and c >= 0],
                               [int(c) for c, r in zip(sides[2], sides[3]) if r == b and c >= 0]) for b in range(B)]
    assert max(want) > 5 and min(want) == 0
    assert levenshtein(*sides, B).tolist() == want
    assert levenshtein_torch(*sides, B).tolist() == want


def test_levenshtein_on_the_device_reads_nothing_with_bounds_and_equals_the_recurrence():
    """`levenshtein_torch` given bounds on the rows' numbers of entries (tight, loose, either side the larger; one
    side empty in some rows, no rows at all) makes no host sync (`SyncCounter`) and equals the textbook recurrence."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from count_ops import SyncCounter

    rng = np.random.default_rng(34)
    B = 30
    sides = []
    for top in (9, 14):
        lengths = rng.integers(0, top + 1, size=B)
        lengths[B // 2:B // 2 + 3] = 0  # rows with nothing on this side
        rows = np.repeat(np.arange(B), lengths)
        codes = np.where(rng.random(len(rows)) < 0.2, -1, rng.integers(0, 5, size=len(rows)))
        sides += [torch.from_numpy(codes), torch.from_numpy(rows)]
    lists = [x.tolist() for x in sides]
    rows_of = lambda k, b: [c for c, r in zip(lists[k], lists[k + 1]) if r == b and c >= 0]  # noqa: E731
    want = [oracle_levenshtein(rows_of(0, b), rows_of(2, b)) for b in range(B)]
    a_max, b_max = (max(len(rows_of(k, b)) for b in range(B)) for k in (0, 2))
    assert max(want) > 5 and min(want) == 0 and a_max != b_max
    for widths in ((a_max, b_max), (a_max + 3, b_max), (a_max, b_max + 7), (b_max + 5, b_max)):
        with SyncCounter() as syncs:
            got = levenshtein_torch(*sides, B, widths)
        assert syncs.total == 0, dict(syncs.calls)
        assert got.tolist() == want, widths
    empty = torch.zeros(0, dtype=torch.long)
    assert levenshtein_torch(empty, empty, empty, empty, 0, (0, 0)).tolist() == []
    assert levenshtein_torch(*sides[:2], empty, empty, B, (a_max, 0)).tolist() == [
        len(rows_of(0, b)) for b in range(B)]


def test_the_decoders_keyboard_bound_holds_every_rows_keys(format_vocab):
    """Generation on the torch decoder: ``keyboard_bound`` (read with the numbers of events) is at least each row's
    number of valid keyboard events of each side, and the least number of keyboard type tokens of a row; the compiled
    decoder gives none."""
    from owa_metrics.schema import Category, Kind, Status

    rng = np.random.default_rng(3)
    keys = [("keyboard", 10 * i, dict(vk=65 + i, action=("press", "release")[i % 2])) for i in range(6)]
    moves = [("mouse", 10 * i + 5, dict(dx=i, dy=-i)) for i in range(4)]
    rows = [format_vocab.encode(_events(sorted(keys[:k] + moves[:m], key=lambda e: e[1])))
            for k, m in ((6, 4), (2, 0), (0, 3), (5, 1))]
    target = pad(rows)
    preds = target.clone()
    preds[1, 3:9] = int(rng.integers(0, format_vocab.size))  # a corrupted generated row
    preds = torch.cat([preds, torch.full((len(rows), 5), -100)], 1)
    batch = decode_batch(preds, target, format_vocab, "generation", backend="torch")
    for side, fields, row in (("target", batch.target, batch.seq_idx), ("generated", batch.generated,
                                                                        batch.generated_seq)):
        valid = (fields.status == int(Status.VALID)) & (fields.category == int(Category.KEYBOARD))
        per_row = torch.bincount(row[valid], minlength=len(rows))
        typed = torch.bincount(row[fields.kind == int(Kind.KEYBOARD)], minlength=len(rows))
        bound = batch.keyboard_bound[0 if side == "target" else 1]
        assert bound >= int(per_row.max()) and bound >= int(typed.max()), (side, bound, per_row, typed)
    assert batch.keyboard_bound[0] == 6
    assert decode_batch(preds, target, format_vocab, "generation", backend="kernel").keyboard_bound is None


def test_a_batch_without_its_generated_side_is_refused(tokenizer):
    metric = OWAEventMetrics(tokenizer, alignment="generation")
    ids = pad([metric.vocab.encode(_events([("mouse", 100, dict(dx=1, dy=0))]))])
    batch = decode_batch(ids, ids, metric.vocab, "generation")
    batch.generated = None  # an EventBatch built by hand
    with pytest.raises(ValueError, match="decode_batch"):
        metric.update(batch)


def test_compiled_cursor_offsets_equal_the_torch_ops(recording_rows, format_vocab):
    """The CPU kernel path's one pass (`_cursor_offsets_by_index`) gives the torch ops' offsets bit for bit (NaN where
    they have NaN) on the recordings' rows (invalid true events, dropped / inserted / garbage generated events,
    rows without events), index pairing."""
    from owa_metrics.functional.sequences import cursor_offsets

    rows, _ = recording_rows
    seen = 0
    for preds, targets in zip(rows["preds"], rows["targets"]):
        batches = [decode_batch(pad(preds), pad(targets), format_vocab, "generation", backend=backend)
                   for backend in ("kernel", "torch")]
        assert batches[0].keyboard_bound is None and batches[1].keyboard_bound is not None  # the two decoders
        got, want = (cursor_offsets(batch, extras) for batch, extras in zip(batches, ({"host_reads": True}, {})))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        seen += int((~torch.isnan(got[0])).sum()) + int((~torch.isnan(got[1])).sum())
    assert seen > 10
