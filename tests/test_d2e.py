"""Issue 31: the D2E protocol (upstream's binned metrics), offline on MCAP pairs and in training on token sequences.

Every key is compared with tests/d2e_oracle.py, written from the issue's protocol text (plain Python over the
files' messages), on the real recordings and on synthetic pairs; the token route with the MCAP route.
"""

import contextlib
import io
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from owa_metrics import CodecConfig, EventCodec, OWAEventMetrics, VocabMap, build_tokenizer
from owa_metrics.cli import main
from owa_metrics.offline.d2e import evaluate_d2e, pair_states
from owa_metrics.events.d2e import read_d2e_recording
from owa_metrics.functional.d2e import d2e_keys, shift_rows
from owa_metrics.schema import Event
from conftest import recording_paths
from d2e_oracle import convert_recording, oracle, oracle_events, pearson, read_real, write_mcap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # count_ops: the host reads
MS = 1_000_000
SHIFTS = tuple(range(-3, 4))


def _at_shift(keys: dict, k: int) -> dict:
    """The ``d2e/..._shift_{k}bins`` keys of a report, named as the oracle names them."""
    suffix = f"_shift_{k}bins"
    return {key[len("d2e/"):-len(suffix)]: v for key, v in keys.items() if key.endswith(suffix)}


def _plain(keys: dict) -> dict:
    return {key[len("d2e/"):]: v for key, v in keys.items() if "_shift_" not in key and key != "d2e/best_shift_bins"}


def _same(got: dict, want: dict, tol: float = 1e-9) -> None:
    assert got.keys() == want.keys(), (sorted(got.keys() ^ want.keys()), got, want)
    differ = {k: (got[k], v) for k, v in want.items() if not (got[k] == v or abs(got[k] - v) <= tol)}
    assert not differ, differ


def _check_pair(truth_path, pred_path, bins_ms=(33, 50, 100), shifts=SHIFTS):
    """Every key at every shift, bin width and empty-bin rule against the oracle; returns the plain 50 ms keys."""
    truth, pred = read_d2e_recording(truth_path), read_d2e_recording(pred_path)
    for bin_ms in bins_ms:
        states = pair_states(truth, pred, bin_ms, shifts)
        for empty in (False, True):
            keys = d2e_keys(states, empty, shift_rows(shifts))
            want = oracle(truth_path, pred_path, bin_ms, empty)
            _same(_plain(keys), want)
            for k in shifts:
                want = oracle(truth_path, pred_path, bin_ms, empty, shift=k)
                want.pop("duration_s")
                _same(_at_shift(keys, k), want)
                assert _at_shift(keys, 0) == {n: v for n, v in _plain(keys).items() if n != "duration_s"}


def test_mcap_route_equals_the_protocol_on_real_recordings(d2e_pairs):
    for truth, pred in d2e_pairs:
        _check_pair(truth, pred, shifts=(-2, 0, 1))
    keys = evaluate_d2e(d2e_pairs[0][1], d2e_pairs[0][0])
    assert {"d2e/mouse_move/pearson_x", "d2e/mouse_move/pearson_y", "d2e/mouse_button/button_accuracy",
            "d2e/keyboard/key_accuracy"} <= keys.keys()
    assert 0.5 < keys["d2e/mouse_move/pearson_x"] < 1 and keys["d2e/num_bins"] > 150


def _synthetic(tmp_path, name, pred_moves=True):
    """A true and a predicted recording on different clocks (2025 vs 1970), the prediction starting 120 ms later
    in video time and ending early; several button bits in one message, wheel messages with dx / dy, events
    exactly at the common range's start and end, and (``pred_moves=False``) no moves on the prediction's side."""
    rng = np.random.default_rng(len(name))
    t_clock, p_clock = 1_750_000_000_000_000_000, 5_000_000_000
    t_pts, p_pts = 1_000 * MS, 1_120 * MS  # the common range starts at the prediction's first screen: 1.12 s
    end = 1_120 * MS + 2_345 * MS  # ... and ends at its last message (2.345 s later, not a multiple of a bin)
    truth_events, pred_events = [], []
    for side, events, n in ((0, truth_events, 120), (1, pred_events, 90)):
        times = np.sort(rng.integers(t_pts if side == 0 else p_pts, end + 300 * MS, n))
        for t in times.tolist():
            r = rng.random()
            if r < 0.3:
                events.append(("k", t, ["press", "release"][int(rng.integers(2))], int(rng.choice([65, 66, 13]))))
            elif r < 0.4:
                flags = int(rng.choice([0x001, 0x002, 0x004, 0x001 | 0x004 | 0x020, 0x008 | 0x010]))
                events.append(("m", t, int(rng.integers(-5, 6)), int(rng.integers(-5, 6)), flags))
            elif r < 0.47:
                events.append(("m", t, int(rng.integers(-9, 9)), 3, int(rng.choice([0x400, 0x800]))))  # wheels
            elif side == 0 or pred_moves:
                events.append(("m", t, int(rng.integers(-30, 31)), int(rng.integers(-20, 21)), 0))
    truth_events += [("m", p_pts, 7, -3, 0), ("k", p_pts, "press", 70), ("m", end, 11, 5, 0), ("k", end, "release", 70),
                     ("m", p_pts - 1, 50, 50, 0)]  # at the start, at the end (dropped), just before the start
    pred_events += [("m", p_pts, 6, -2, 0)] * pred_moves + [("k", end, "release", 70)]
    pred_events = [e for e in pred_events if e[1] <= end]  # the prediction ends early: at `end`

    def write(path, events, clock, pts, tail):
        keys = [(t - pts + clock, e, vk) for kind, t, e, vk, *_ in [x + (None,) for x in events] if kind == "k"]
        mice = [(t - pts + clock, dx, dy, f) for kind, t, dx, dy, f in [x for x in events if x[0] == "m"]]
        screens = [(clock, pts), (clock + 40 * MS, pts + 40 * MS)]
        return write_mcap(path, screens, keys, mice, tail_ns=None if tail is None else tail - pts + clock)

    truth = write(tmp_path / f"{name}_true.mcap", truth_events, t_clock, t_pts, end + 500 * MS)
    pred = write(tmp_path / f"{name}_pred.mcap", pred_events, p_clock, p_pts, end)
    return truth, pred


@pytest.mark.parametrize("bin_ms", [33, 50, 100])
def test_mcap_route_equals_the_protocol_on_synthetic_pairs(tmp_path, bin_ms):
    truth, pred = _synthetic(tmp_path, "mixed")
    _check_pair(truth, pred, bins_ms=(bin_ms,))
    still_truth, still_pred = _synthetic(tmp_path, "still", pred_moves=False)
    _check_pair(still_truth, still_pred, bins_ms=(bin_ms,), shifts=(-1, 0, 2))
    keys = evaluate_d2e(still_pred, still_truth, bin_ms)
    assert "d2e/mouse_move/pearson_x" not in keys and "d2e/mouse_move/scale_ratio_x" not in keys  # no moves: none
    assert keys["d2e/duration_s"] == pytest.approx(2.345, abs=1e-12)
    assert keys["d2e/num_bins"] == -(-2345 // bin_ms)


def test_bins_of_many_sequences_in_fixed_shapes_equal_the_protocol_per_sequence(monkeypatch):
    """Issue 34: the torch bins of several sequences at once, each its own group (a tag), with no host read (the
    counter of scripts/count_ops.py sees none): each group's keys at every shift equal the protocol over that
    sequence alone (the oracle), the ungrouped sums the groups' sums. The sequences: ranges on their own axes (one
    at negative times, one empty, one that ends inside a bin), events outside the ranges and exactly at their ends,
    several button bits in one message, wheel messages, a side with no events in a sequence, key names colliding
    across sequences and bins, and events that do not count (left out of the oracle). In blocks (a long recording's
    size), the same sums."""
    from count_ops import SyncCounter
    from owa_metrics.functional import d2e as d2e_module
    from owa_metrics.functional.d2e import D2EEvents, d2e_states

    rng = np.random.default_rng(7)
    bin_ms, shifts = 50, (-2, -1, 0, 1, 3)
    ranges = [(0, 2_000 * MS), (-1_234 * MS, 1_001 * MS), (500 * MS, 500 * MS), (10 * MS, 437 * MS)]
    sides, oracle_sides = [], []
    for side in range(2):
        cols, oracle_events_by_seq = {k: [] for k in ("seq", "ns", "is_key", "key_code", "dx", "dy", "flags", "ok")}, []
        for b, (start, end) in enumerate(ranges):
            events = []
            n = 0 if (side, b) == (1, 3) else int(rng.integers(20, 80))
            times = rng.integers(start - 200 * MS, max(end, start) + 200 * MS, n).tolist() + [start, end] * (n > 0)
            for t in times:
                r, ok = rng.random(), rng.random() > 0.1
                if r < 0.35:
                    vk, action = int(rng.choice([65, 66, 13])), int(rng.integers(2))
                    row = (b, t, True, vk * 2 + action, 0, 0, 0, ok)
                    d = ("keyboard", {"event_type": ["press", "release"][action], "vk": vk})
                else:
                    flags = int(rng.choice([0, 0, 0, 0x001, 0x002 | 0x004, 0x001 | 0x008 | 0x020, 0x010, 0x400, 0x800]))
                    dx, dy = int(rng.integers(-30, 31)), int(rng.integers(-20, 21))
                    row = (b, t, False, 0, dx, dy, flags, ok)
                    d = ("mouse/raw", {"dx": dx, "dy": dy, "button_flags": flags})
                for k, v in zip(cols, row):
                    cols[k].append(v)
                if ok:
                    events.append((t, d[0], type("Decoded", (), d[1])()))
            oracle_events_by_seq.append(events)
        order = rng.permutation(len(cols["ns"]))  # any order of the events
        t = {k: torch.tensor(v)[order] for k, v in cols.items()}
        sides.append(D2EEvents(t["seq"], t["ns"], t["is_key"], t["key_code"], t["dx"], t["dy"], t["flags"], t["ok"]))
        oracle_sides.append(oracle_events_by_seq)
    start, end = (torch.tensor(x) for x in zip(*ranges))
    d2e_states(*sides, start, end, bin_ms * MS, shifts)  # the shifts are copied to the device once (cached)
    with SyncCounter(host_data=True) as syncs:
        by_group = d2e_states(*sides, start, end, bin_ms * MS, shifts, torch.arange(len(ranges)), len(ranges))
        pooled = d2e_states(*sides, start, end, bin_ms * MS, shifts)
    assert syncs.total == 0, dict(syncs.calls)
    assert torch.equal(pooled, by_group.sum(0))
    monkeypatch.setattr(d2e_module, "_PAIRS", 50)  # long recordings: blocks of (shift, run) pairs, a few shifts each
    assert torch.equal(d2e_states(*sides, start, end, bin_ms * MS, shifts, torch.arange(len(ranges)), len(ranges)),
                       by_group)
    # the compiled loop (the MCAP route's, the compiled CPU path's): the same sums
    assert torch.equal(d2e_states(*sides, start, end, bin_ms * MS, shifts, torch.arange(len(ranges)), len(ranges),
                                  compiled=True), by_group)
    for b, (lo, hi) in enumerate(ranges):
        if hi <= lo:
            assert not by_group[b].any()
            continue
        for empty in (False, True):
            keys = d2e_keys(by_group[b], empty, shifts)
            for k in shifts:
                want = oracle_events(oracle_sides[0][b], oracle_sides[1][b], lo, hi, bin_ms, empty, shift=k)
                assert keys["d2e/duration_s"] == want.pop("duration_s")
                _same(_at_shift(keys, k), want)


def _moves_pair(tmp_path, name, truth_bins, pred_bins, bin_ms=50):
    """A pair of recordings whose bin i holds the moves ``truth_bins[i]`` / ``pred_bins[i]`` (lists of (dx, dy)),
    spread over the bin; the common range is the bins'."""
    width = bin_ms * MS
    mice = [[(i * width + j * width // (len(moves) + 1), dx, dy, 0) for j, (dx, dy) in enumerate(moves)]
            for bins in (truth_bins, pred_bins) for i, moves in enumerate(bins)]
    end = len(truth_bins) * width
    half = len(truth_bins)
    return [write_mcap(tmp_path / f"{name}_{side}.mcap", [(0, 0)], (), [m for rows in mice[at:at + half] for m in rows],
                       tail_ns=end) for side, at in (("true", 0), ("pred", half))]


def test_moments_are_exact_at_any_int32_move(tmp_path):
    """Issue 46 item 1: moves of +-(2**31 - 1), several per bin (products past int64), and dx = 10**6 +- 3 over
    12,000 bins (sums past 2**53, cancellation in n Σtp - Σt Σp): every key equals the exact rational oracle to
    1e-12, on the MCAP route (the compiled loop), the torch ops (equal sums), and pooled over both files (their states
    added, as ranks add them)."""
    from owa_metrics.offline.d2e import evaluate_d2e_folders, pair_events
    from owa_metrics.functional.d2e import d2e_states

    rng, big = np.random.default_rng(46), 2**31 - 1
    signs = lambda n: rng.choice([-1, 1], n)  # noqa: E731
    huge_t = [[(int(x) * big, int(y) * big) for x, y in zip(signs(k), signs(k))] for k in rng.integers(2, 6, 40)]
    huge_p = [[(x if rng.random() < 0.8 else -x, -y) for x, y in moves][:len(moves) - (i % 3 == 0)] or [(big, big)]
              for i, moves in enumerate(huge_t)]
    noise = rng.integers(-3, 4, 12_000)
    close_t = [[(10**6 + int(a), 7 + i % 3)] for i, a in enumerate(noise)]
    close_p = [[(10**6 + int(a) + int(rng.integers(-1, 2)), 7 + (i % 2))] for i, a in enumerate(noise)]
    (tmp_path / "t").mkdir()
    pairs = {"huge": _moves_pair(tmp_path / "t", "huge", huge_t, huge_p),
             "close": _moves_pair(tmp_path / "t", "close", close_t, close_p)}
    want = {}
    for name, (truth, pred) in pairs.items():
        want[name] = oracle(truth, pred, 50)
        _same(evaluate_d2e(pred, truth), {f"d2e/{k}": v for k, v in want[name].items()}, 1e-12)
        t, p = read_d2e_recording(truth), read_d2e_recording(pred)
        compiled = pair_states(t, p, 50)
        rng_ = torch.tensor([[0], [len(huge_t if name == "huge" else close_t) * 50 * MS]])
        torch_ops = d2e_states(*pair_events(t, p), *rng_, 50 * MS)
        assert torch.equal(torch_ops, compiled)
    assert want["huge"]["mouse_move/pearson_x"] < 0.95 and 0.5 < want["close"]["mouse_move/pearson_x"] < 0.99
    for side in ("true", "pred"):  # both pairs in two folders: the pooled keys over all their bins
        (tmp_path / side).mkdir()
        for name, (truth, pred) in pairs.items():
            (tmp_path / side / f"{name}.mcap").write_bytes((truth if side == "true" else pred).read_bytes())
    pooled = evaluate_d2e_folders(tmp_path / "pred", tmp_path / "true")
    sums = lambda bins, j: [sum(m[j] for m in moves) for moves in bins]  # noqa: E731
    for axis, j in (("x", 0), ("y", 1)):
        exact = pearson(sums(huge_t + close_t, j), sums(huge_p + close_p, j))
        assert pooled[f"d2e/mouse_move/pearson_{axis}"] == pytest.approx(exact, abs=1e-12)
        for name in pairs:
            assert pooled[f"tag/{name}/d2e/mouse_move/pearson_{axis}"] == pytest.approx(
                want[name][f"mouse_move/pearson_{axis}"], abs=1e-12)


def _random_events(rng, n, end_ms, vks=(65, 66), us_flags=(0,)):
    """``n`` keys and ``n`` mouse events at random times in [0, end_ms) ms: keys of ``vks``, moves, clicks and
    wheels, the clicks and wheels carrying one of ``us_flags``."""
    times = lambda: np.sort(rng.integers(0, end_ms * MS, n)).tolist()  # noqa: E731
    keys = [(t, ["press", "release"][int(rng.integers(2))], int(rng.choice(vks))) for t in times()]
    mice = []
    for t in times():
        flags = int(rng.choice([0, 0, 0x001, 0x002, 0x004 | 0x008, 0x400]))
        mice.append((t, int(rng.integers(-9, 10)), int(rng.integers(-9, 10)), flags,
                     0 if flags == 0 else int(rng.choice(us_flags))))
    return keys, mice


def test_reads_clicks_with_us_flags_and_refuses_only_a_move_with_them_in_range(tmp_path):
    """Issue 46 item 2: upstream reads a click or wheel whatever its us_flags (it reads only button_flags) and
    cannot read the dx / dy of a move with non-zero us_flags (RawMouseEvent.dx raises): clicks and wheels with
    0x1 / 0x4 count as the oracle counts them, a move with 0x4 after the compared range is never read, one inside
    refuses the file, named, without calling it absolute."""
    from owa_metrics.events.d2e import RecordingError

    rng = np.random.default_rng(11)
    keys, mice = _random_events(rng, 60, 2_000, us_flags=(0, 0x1, 0x4))
    truth = write_mcap(tmp_path / "t.mcap", [(0, 0)], keys, mice + [(1_800 * MS, 3, 3, 0, 0x4)], tail_ns=2_000 * MS)
    keys, mice = _random_events(rng, 50, 1_500, us_flags=(0, 0x4))
    pred = write_mcap(tmp_path / "p.mcap", [(0, 0)], keys, mice, tail_ns=1_500 * MS)
    _check_pair(truth, pred, bins_ms=(50,), shifts=(-1, 0, 1))
    bad = write_mcap(tmp_path / "bad.mcap", [(0, 0)], keys, mice + [(700 * MS, 3, 3, 0, 0x4)], tail_ns=1_500 * MS)
    with pytest.raises(RecordingError, match="us_flags") as err:
        evaluate_d2e(bad, truth)
    assert str(bad) in str(err.value) and str(truth) not in str(err.value) and "absolute" not in str(err.value)
    code, _, err = _cli(["--pred", bad, "--target", truth, "--bin-ms", 50])
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(bad) in err and "0x4" in err


def test_any_vk_is_its_own_key_name_and_the_first_screen_is_the_earliest(tmp_path):
    """Issue 46 item 2: negative and large vks (upstream's name ``{event_type}_{vk}`` for any int) each count under
    their own name, in their own bin, at every bin width, shift and empty-bin rule; the prediction's file holds a
    screen without media_ref written before its earliest screen (upstream reads the screens in log-time order)."""
    rng = np.random.default_rng(12)
    vks = (-1, -2, -300, 0, 65, 70_000, 2**40)
    keys, mice = _random_events(rng, 120, 2_000, vks)
    truth = write_mcap(tmp_path / "t.mcap", [(0, 0)], keys, mice, tail_ns=2_000 * MS)
    keys = [(t + int(rng.integers(-30, 30)) * MS * (i % 2), e, vk) for i, (t, e, vk) in enumerate(keys)]
    pred = write_mcap(tmp_path / "p.mcap", [(900 * MS, None), (5 * MS, 5 * MS)], [k for k in keys if k[0] >= 5 * MS],
                      mice, tail_ns=1_900 * MS, in_time_order=False)
    assert read_d2e_recording(pred).first_screen_ns == 5 * MS
    _check_pair(truth, pred, bins_ms=(33, 50), shifts=(-2, 0, 1))


def test_bin_ms_beyond_int64_nanoseconds_is_refused_by_name(tmp_path, tokenizer):
    """Issue 46 item 2: a bin of more than 2**63 - 1 ns is refused before any file is read, naming ``bin_ms``
    (the API) or ``--bin-ms`` (the CLI); a bin just below it gives one bin over the range."""
    truth = write_mcap(tmp_path / "t.mcap", [(0, 0)], [(5 * MS, "press", 65)], [(7 * MS, 1, 2, 0)], tail_ns=90 * MS)
    for bin_ms in (1e13, 2**63 / 1e6, 1e300):
        with pytest.raises(ValueError, match="bin_ms"):
            evaluate_d2e(truth, truth, bin_ms)
        with pytest.raises(ValueError, match="bin_ms"):
            OWAEventMetrics(tokenizer, bin_ms=bin_ms)
        code, _, err = _cli(["--pred", truth, "--target", truth, "--bin-ms", bin_ms])
        assert code == 2 and "--bin-ms" in err and str(truth) not in err, err
    largest = 9.2e12  # 9.2e18 ns < 2**63
    _same(evaluate_d2e(truth, truth, largest), {f"d2e/{k}": v for k, v in oracle(truth, truth, largest).items()})
    assert evaluate_d2e(truth, truth, largest)["d2e/num_bins"] == 1


def test_errors_name_the_bad_file_and_why(tmp_path):
    """Issue 46 item 2: a missing file is said not to exist; a truncated MCAP and a file that is not MCAP are named
    alone (not the pair), by the API, the CLI (one line, exit 2) and folder mode."""
    from owa_metrics.offline.d2e import evaluate_d2e_folders
    from owa_metrics.events.d2e import RecordingError

    good = write_mcap(tmp_path / "good.mcap", [(0, 0)], [(5 * MS, "press", 65)], [(7 * MS, 1, 2, 0)], tail_ns=90 * MS)
    truncated = tmp_path / "truncated.mcap"
    truncated.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    text = tmp_path / "text.mcap"
    text.write_text("not an MCAP file\n")
    missing = tmp_path / "missing.mcap"
    for bad in (missing, truncated, text):
        with pytest.raises(RecordingError) as err:
            evaluate_d2e(bad, good)
        assert str(bad) in str(err.value) and str(good) not in str(err.value)
        assert ("does not exist" in str(err.value)) == (bad == missing)
        for args in (["--pred", bad, "--target", good], ["--pred", good, "--target", bad]):
            code, _, err = _cli([*args, "--bin-ms", 50])
            assert code == 2 and len(err.strip().splitlines()) == 1 and str(bad) in err and str(good) not in err, err
            assert ("does not exist" in err) == (bad == missing)
    for side in ("pred", "true"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "a.mcap").write_bytes(good.read_bytes())
    (tmp_path / "pred" / "b.mcap").write_bytes(good.read_bytes())
    (tmp_path / "true" / "b.mcap").write_bytes(truncated.read_bytes())
    with pytest.raises(RecordingError) as err:
        evaluate_d2e_folders(tmp_path / "pred", tmp_path / "true")
    assert str(tmp_path / "true" / "b.mcap") in str(err.value) and "pred" not in str(err.value).replace(
        str(tmp_path / "true"), "")


def test_a_hand_computed_pair(tmp_path):
    """Bins [0, 50), [50, 100), [100, 125) ms. Truth: moves (1, 0) and (2, 1) in bin 0, (-4, 1) in bin 1, a left
    down in bin 1, a wheel in bin 2; keys press A, release A (bin 0), press B (bin 1). Prediction: move (1, 0) in
    bin 0, (3, 1) in bin 1, left down + up in one message in bin 2; press A (bin 0), release A (bin 1).
    x: sums (3, -4, 0) vs (1, 3, 0), Pearson over bins 0, 1: -1; scale 7 / 4. y: (1, 1) is constant: no Pearson;
    scale 2 / 1. Over all 3 bins (the paper's r): x (3, -4, 0) vs (1, 3, 0), deviations (10, -11, 1) / 3 and
    (-1, 5, -4) / 3: r = -69 / sqrt(222 * 42); y (1, 1, 0) vs (0, 1, 0), deviations (1, 1, -2) / 3 and (-1, 2, -1) / 3:
    r = 3 / sqrt(6 * 6) = 0.5. Buttons: left_down in bin 1 (1 vs 0), left_down and left_up in bin 2 (0 vs 1): 0 / 3, bin 0
    empty. Keys: bin 0 press A 1 = 1, release A 1 vs 0; bin 1 press B 1 vs 0, release A 0 vs 1: 1 / 4, bin 2 empty.
    Strict (issue 46): bins 0 and 1 have true keys, neither alike: 0 / 2; bin 2 has none, nor a predicted one: FP rate
    0 / 1. Buttons: bin 1 true (left_down), bin 2 predicted: TP 0, precision 0 / 1, recall 0 / 1, F1 0 / 2; bins 0
    and 2 have no true button, bin 2 a predicted one: FP rate 1 / 2.
    """
    screens = [(10_000 * MS, 0)]
    truth = write_mcap(tmp_path / "t.mcap", screens, [(10_000 * MS, "press", 65), (10_010 * MS, "release", 65),
                                                      (10_060 * MS, "press", 66)],
                       [(10_005 * MS, 1, 0, 0), (10_020 * MS, 2, 1, 0), (10_055 * MS, 0, 0, 1),
                        (10_070 * MS, -4, 1, 0), (10_120 * MS, 0, 0, 0x400)], tail_ns=10_125 * MS)
    pred = write_mcap(tmp_path / "p.mcap", [(7 * MS, 0)], [(7 * MS, "press", 65), (77 * MS, "release", 65)],
                      [(12 * MS, 1, 0, 0), (67 * MS, 3, 1, 0), (117 * MS, 0, 0, 3)], tail_ns=200 * MS)
    want = {"d2e/num_bins": 3, "d2e/duration_s": 0.125, "d2e/mouse_move/pearson_x": -1.0,
            "d2e/mouse_move/pearson_x_all_bins": -69 / math.sqrt(222 * 42), "d2e/mouse_move/pearson_y_all_bins": 0.5,
            "d2e/mouse_move/scale_ratio_x": 1.75, "d2e/mouse_move/scale_ratio_y": 2.0,
            "d2e/mouse_move/sample_count": 2, "d2e/mouse_button/button_accuracy": 0.0,
            "d2e/mouse_button/sample_count": 3, "d2e/keyboard/key_accuracy": 0.25, "d2e/keyboard/sample_count": 4,
            "d2e/keyboard/strict_accuracy": 0.0, "d2e/keyboard/strict_sample_count": 2,
            "d2e/keyboard/false_positive_rate": 0.0, "d2e/keyboard/false_positive_sample_count": 1,
            "d2e/mouse_button/precision": 0.0, "d2e/mouse_button/recall": 0.0, "d2e/mouse_button/f1": 0.0,
            "d2e/mouse_button/false_positive_rate": 0.5, "d2e/mouse_button/false_positive_sample_count": 2}
    _same(evaluate_d2e(pred, truth), want, 1e-12)
    want.update({"d2e/mouse_button/button_accuracy": 0.25, "d2e/mouse_button/sample_count": 4,
                 "d2e/keyboard/key_accuracy": 0.4, "d2e/keyboard/sample_count": 5})
    _same(evaluate_d2e(pred, truth, empty_bins_as_correct=True), want, 1e-12)
    keys_only = write_mcap(tmp_path / "k.mcap", [(7 * MS, 0)], [(7 * MS, "press", 65)], tail_ns=200 * MS)
    _same(evaluate_d2e(keys_only, truth), {  # no mouse event at all: no Pearson, no ratio; 3 true button values
        "d2e/num_bins": 3, "d2e/duration_s": 0.125, "d2e/mouse_move/sample_count": 2,
        "d2e/mouse_button/button_accuracy": 0.0, "d2e/mouse_button/sample_count": 1,
        "d2e/keyboard/key_accuracy": 1 / 3, "d2e/keyboard/sample_count": 3,
        "d2e/keyboard/strict_accuracy": 0.0, "d2e/keyboard/strict_sample_count": 2,  # no predicted button: no
        "d2e/keyboard/false_positive_rate": 0.0, "d2e/keyboard/false_positive_sample_count": 1,  # precision
        "d2e/mouse_button/recall": 0.0, "d2e/mouse_button/f1": 0.0,
        "d2e/mouse_button/false_positive_rate": 0.0, "d2e/mouse_button/false_positive_sample_count": 2}, 1e-12)


def test_the_community_strict_keys_by_hand(tmp_path):
    """Issue 46 item 4, four bins of 50 ms. Truth: bin 0 left down, press A; bin 1 left down + up in one message,
    press A, release A; bin 2 right down; bin 3 nothing. Prediction: bin 0 left down, press A; bin 1 left down,
    press A, release A; bin 2 nothing; bin 3 left up, press B. Keyboard: bins 0 and 1 have true keys, both alike:
    1; of bins 2 and 3 (no true key) bin 3 has a predicted one: 1 / 2. Buttons: true in bins 0, 1, 2, predicted in
    0, 1, 3, alike in bin 0: precision = recall = F1 = 1 / 3; bin 3 (no true button) has a predicted one: 1 / 1. The
    compiled loop (the MCAP route) and the torch ops."""
    from owa_metrics.offline.d2e import pair_events
    from owa_metrics.functional.d2e import d2e_states

    at = lambda b, ms=10: (b * 50 + ms) * MS  # noqa: E731
    truth = write_mcap(tmp_path / "t.mcap", [(0, 0)], [(at(0), "press", 65), (at(1), "press", 65),
                                                       (at(1, 20), "release", 65)],
                       [(at(0), 0, 0, 0x1), (at(1), 0, 0, 0x3), (at(2), 0, 0, 0x4)], tail_ns=200 * MS)
    pred = write_mcap(tmp_path / "p.mcap", [(0, 0)], [(at(0), "press", 65), (at(1), "press", 65),
                                                      (at(1, 20), "release", 65), (at(3), "press", 66)],
                      [(at(0), 0, 0, 0x1), (at(1), 0, 0, 0x1), (at(3), 0, 0, 0x2)], tail_ns=200 * MS)
    want = {"keyboard/strict_accuracy": 1.0, "keyboard/strict_sample_count": 2, "keyboard/false_positive_rate": 0.5,
            "keyboard/false_positive_sample_count": 2, "mouse_button/precision": 1 / 3, "mouse_button/recall": 1 / 3,
            "mouse_button/f1": 1 / 3, "mouse_button/false_positive_rate": 1.0,
            "mouse_button/false_positive_sample_count": 1}
    got = evaluate_d2e(pred, truth)
    _same({k: got[f"d2e/{k}"] for k in want}, want, 1e-12)
    states = d2e_states(*pair_events(read_d2e_recording(truth), read_d2e_recording(pred)), torch.tensor([0]),
                        torch.tensor([200 * MS]), 50 * MS)
    assert torch.equal(states, pair_states(read_d2e_recording(truth), read_d2e_recording(pred)))
    assert {k: v for k, v in oracle(truth, pred, 50).items() if k in want} == want


def test_shift_diagnostics_find_a_delayed_prediction(tmp_path):
    """The prediction is the truth 100 ms (2 bins of 50 ms) late: best shift +2, where it scores 1 everywhere."""
    rng = np.random.default_rng(3)
    times = np.sort(rng.choice(np.arange(0, 6_000, 5), 300, replace=False)) * MS
    keys = [(int(t), ["press", "release"][i % 2], 65 + i % 3) for i, t in enumerate(times[::3])]
    mice = [(int(t), int(rng.integers(-40, 41)), int(rng.integers(-40, 41)), int(rng.choice([0, 0, 0, 1, 2])))
            for t in times]
    truth = write_mcap(tmp_path / "t.mcap", [(0, 0)], keys, mice, tail_ns=6_500 * MS)
    late = lambda rows: [(t + 100 * MS, *rest) for t, *rest in rows]  # noqa: E731
    pred = write_mcap(tmp_path / "p.mcap", [(0, 0)], late(keys), late(mice), tail_ns=6_600 * MS)
    got = evaluate_d2e(pred, truth, 50, bin_shifts=SHIFTS)
    assert got["d2e/best_shift_bins"] == 2
    assert got["d2e/keyboard/key_accuracy_shift_2bins"] == 1 and got["d2e/mouse_button/button_accuracy_shift_2bins"] == 1
    assert got["d2e/mouse_move/pearson_x_shift_2bins"] == pytest.approx(1, abs=1e-12)
    assert got["d2e/keyboard/key_accuracy_shift_-2bins"] < 0.2
    _same(_at_shift(got, 0), {k: v for k, v in _plain(got).items() if k != "duration_s"}, 0)
    for k in (-2, 2):
        want = oracle(truth, pred, 50, shift=k)
        want.pop("duration_s")
        _same(_at_shift(got, k), want)


def _cli(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["evaluate", *map(str, args)])
    return code, out.getvalue(), err.getvalue()


def test_cli_gives_the_protocol_and_refuses_bad_input(d2e_pairs, tmp_path):
    truth, pred = d2e_pairs[0]
    code, out, err = _cli(["--pred", pred, "--target", truth, "--bin-ms", 50, "--empty-bins-as-correct",
                           "--bin-shifts", -1, 1, "--json", tmp_path / "r.json"])
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    _same(_plain(report), oracle(truth, pred, 50, True))
    _same(_at_shift(report, -1), {k: v for k, v in oracle(truth, pred, 50, True, -1).items() if k != "duration_s"})
    assert "d2e/keyboard/key_accuracy" in out and "best_shift_bins" in out
    no_screen = write_mcap(tmp_path / "no_screen.mcap", [], [(5, "press", 65)])
    late = write_mcap(tmp_path / "late.mcap", [(0, 3_600_000 * MS)], [(5, "press", 65)], tail_ns=MS)
    old_schema = [p for p in recording_paths() if p.name == "0.4.2.mcap"][0]  # its screens carry no pts
    for bad, named in ((no_screen, no_screen), (late, late), (old_schema, old_schema)):
        code, out, err = _cli(["--pred", bad, "--target", truth, "--bin-ms", 50])
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(named) in err, err
    code, _, err = _cli(["--pred", pred, "--target", truth, "--bin-shifts", -3, 3])
    assert code == 2 and "--bin-ms" in err


def test_a_recording_without_raw_mouse_is_said_and_no_shift_scoring_nothing_is_best(tmp_path):
    """Issue 44: the shared example.mcap has 209 absolute ``mouse`` messages and no ``mouse/raw``: the CLI scores
    its mouse over nothing (sample counts 0, as the protocol reads it) and says so in one warning line naming the
    file and the topic (--strict: exit 1). A prediction whose keys are all wrong, without mouse events, scores 0 at
    every shift: no d2e/best_shift_bins (it was 0)."""
    example = [p for p in recording_paths() if p.name == "example.mcap"][0]
    with warnings.catch_warnings(record=True) as leaked:  # the page reads the file again: no second word
        warnings.simplefilter("always")
        code, out, err = _cli(["--pred", example, "--target", example, "--bin-ms", 50, "--json", tmp_path / "r.json",
                               "--html", tmp_path / "r.html"])
    assert not leaked, [str(w.message) for w in leaked]
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and report["d2e/mouse_move/sample_count"] == 0 and report["d2e/keyboard/key_accuracy"] == 1
    warned = err.strip().splitlines()
    assert len(warned) == 1 and str(example) in warned[0] and "mouse/raw" in warned[0] and "209" in warned[0], err
    assert _cli(["--pred", example, "--target", example, "--bin-ms", 50, "--strict"])[0] == 1
    converted = tmp_path / "raw.mcap"
    code, _, err = _cli(["--pred", convert_recording(example, converted), "--target", converted, "--bin-ms", 50])
    assert code == 0 and err == ""  # with mouse/raw: no word

    truth = write_mcap(tmp_path / "t.mcap", [(0, 0)], [(i * 40 * MS, ["press", "release"][i % 2], 65) for i in range(20)],
                       tail_ns=1_000 * MS)
    pred = write_mcap(tmp_path / "p.mcap", [(0, 0)], [(i * 40 * MS, ["press", "release"][i % 2], 66) for i in range(20)],
                      tail_ns=1_000 * MS)
    got = evaluate_d2e(pred, truth, 50, bin_shifts=SHIFTS)
    assert [got[f"d2e/keyboard/key_accuracy_shift_{k}bins"] for k in SHIFTS] == [0.0] * len(SHIFTS)
    assert "d2e/mouse_button/button_accuracy" not in got and "d2e/mouse_move/pearson_x" not in got
    assert "d2e/best_shift_bins" not in got
    code, out, err = _cli(["--pred", pred, "--target", truth, "--bin-ms", 50, "--bin-shifts", -2, 2])
    assert code == 0 and "best_shift_bins" not in out and err == ""


# ------------------------------------------------------------------------------------------ the token route
def _quantized_pair(codec: EventCodec, seed: int = 0):
    """The example recording (true) and a perturbed prediction as `Event`s in video time, on the token format's
    10 ms grid and within its dx / dy range, the prediction ending early; and the common range [0, end]."""
    screens, keys, mice = read_real([p for p in recording_paths() if p.name == "example.mcap"][0])
    rng, first, unit = np.random.default_rng(seed), screens[0], 10 * MS
    grid = lambda t: (t - first) // unit * unit  # noqa: E731
    truth = [Event("keyboard", grid(t), vk=vk, action=e) for t, e, vk in keys]
    truth += [codec.fit(Event("mouse", grid(t), dx=dx, dy=dy, button_flags=f)) for t, dx, dy, f in mice]
    truth = [e for e in truth if e.timestamp_ns >= 0]
    pred = [Event(e.kind, max(0, e.timestamp_ns + int(rng.integers(-4, 5)) * unit), vk=e.vk, action=e.action,
                  dx=None if e.dx is None else int(e.dx * 1.3) + int(rng.integers(-2, 3)), dy=e.dy,
                  button_flags=e.button_flags) for e in truth if rng.random() > 0.15]
    end = grid(screens[-1]) - 1_500 * MS  # the prediction's file ends 1.5 s before the truth's
    pred = sorted((e for e in pred if e.timestamp_ns <= end), key=lambda e: e.timestamp_ns)
    pred = [codec.fit(e) for e in pred] + [Event("screen", end)]  # its last message
    screen_times = sorted({grid(t) for t in screens})
    return sorted(truth, key=lambda e: e.timestamp_ns), pred, screen_times, end


def _write_events(path, events, screen_times, clock_ns):
    keys = [(e.timestamp_ns + clock_ns, e.action, e.vk) for e in events if e.kind == "keyboard"]
    mice = [(e.timestamp_ns + clock_ns, e.dx, e.dy, e.button_flags) for e in events if e.kind == "mouse"]
    return write_mcap(path, [(t + clock_ns, t) for t in screen_times], keys, mice)


def _as_oracle_events(events):
    class Decoded:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    return [(e.timestamp_ns, "keyboard", Decoded(event_type=e.action, vk=e.vk)) if e.kind == "keyboard" else
            (e.timestamp_ns, "mouse/raw", Decoded(dx=e.dx, dy=e.dy, button_flags=e.button_flags))
            for e in events if e.kind != "screen"]


def test_token_route_equals_the_mcap_route_on_a_recording(tmp_path):
    """One recording as one token sequence per side over the MCAP pair's common range (a screen at its start and
    its end close the true sequence's range) gives the MCAP route's keys: generation paired by index and by time,
    torch ops and the compiled path, and teacher forcing (one prediction per true event)."""
    tokenizer = build_tokenizer()
    vocab, codec = VocabMap.from_tokenizer(tokenizer), EventCodec(CodecConfig())
    truth, pred, screen_times, end = _quantized_pair(codec)
    t_path = _write_events(tmp_path / "t.mcap", truth, screen_times, 1_750_000_000_000_000_000)
    p_path = _write_events(tmp_path / "p.mcap", pred, [t for t in screen_times if t <= end], 77 * MS)
    mcap = evaluate_d2e(p_path, t_path, 50, bin_shifts=(-2, 2))
    _same(_plain(mcap), oracle(t_path, p_path, 50))
    assert mcap["d2e/duration_s"] == end / 1e9 and mcap["d2e/mouse_move/sample_count"] > 30

    in_range = [e for e in truth if e.timestamp_ns < end]
    target_events = [Event("screen", 0), *in_range, Event("screen", end)]
    target = torch.tensor([vocab.encode(target_events, ignore_images=True)])
    generated = torch.tensor([vocab.encode([e for e in pred if e.kind != "screen"])])
    for pairing, backend in (("index", "auto"), ("index", "torch"), ("time", "auto")):
        metric = OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing, backend=backend, bin_ms=50,
                                 bin_shifts=(-2, 2), generated_screens="scored")  # the screens bound the range
        metric.update(generated, target)
        got = {k: v.item() for k, v in metric.compute().items() if k.startswith("d2e/")}
        _same(got, mcap)

    rng = np.random.default_rng(1)  # teacher forcing: a prediction of each true event, token for token
    guessed = [e if e.kind == "screen" else Event(
        e.kind, e.timestamp_ns + int(rng.integers(-6, 7)) * 10 * MS, vk=e.vk if rng.random() > 0.2 else 66,
        action=e.action, dx=None if e.dx is None else int(rng.integers(-50, 51)), dy=e.dy,
        button_flags=e.button_flags) for e in target_events]
    preds = torch.tensor([vocab.encode(guessed)])
    assert preds.shape == target.shape
    want = oracle_events(_as_oracle_events(in_range), _as_oracle_events(guessed), 0, end, 50)
    for backend in ("auto", "torch"):
        metric = OWAEventMetrics(tokenizer, bin_ms=50, backend=backend)
        metric.update(preds, target)
        _same(_plain({k: v.item() for k, v in metric.compute().items() if k.startswith("d2e/")}), want)


def test_sequences_add_up_and_options_are_checked():
    """Two sequences in one batch pool their bins (the sums add); the options are checked; off by default."""
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    rows = []
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        times = np.sort(rng.choice(np.arange(100, 900), 40, replace=False)) * 10 * MS
        truth = [Event("mouse", int(t), dx=int(rng.integers(-9, 10)), dy=int(rng.integers(-9, 10))) if i % 3 else
                 Event("keyboard", int(t), vk=65 + i % 2, action="press") for i, t in enumerate(times)]
        pred = [Event(e.kind, e.timestamp_ns + 20 * MS, vk=e.vk, action=e.action,
                      dx=None if e.dx is None else e.dx + 1, dy=e.dy) for e in truth]
        rows.append((truth, pred))
    pad = lambda seqs: torch.tensor([s + [-100] * (max(map(len, seqs)) - len(s)) for s in seqs])  # noqa: E731
    target = pad([vocab.encode(t) for t, _ in rows])
    generated = pad([vocab.encode(p) for _, p in rows])
    metric = OWAEventMetrics(tokenizer, alignment="generation", bin_ms=100, empty_bins_as_correct=True)
    metric.update(generated, target)
    got = _plain({k: v.item() for k, v in metric.compute().items() if k.startswith("d2e/")})
    # the oracle over one recording: the two sequences' ranges laid end to end, 100 s apart (bins of 100 ms)
    gap = 100_000 * MS
    events = [[], []]
    for r, (truth, pred) in enumerate(rows):
        for side, evs in enumerate((truth, pred)):
            events[side] += [(t + r * gap, topic, d) for t, topic, d in _as_oracle_events(evs)]
    starts = [rows[r][0][0].timestamp_ns + r * gap for r in (0, 1)]
    ends = [rows[r][0][-1].timestamp_ns + r * gap for r in (0, 1)]
    parts = [oracle_events(events[0], events[1], s, e, 100, True) for s, e in zip(starts, ends)]
    assert got["num_bins"] == sum(p["num_bins"] for p in parts)
    assert got["keyboard/sample_count"] == sum(p["keyboard/sample_count"] for p in parts)
    right = sum(p["keyboard/key_accuracy"] * p["keyboard/sample_count"] for p in parts)
    assert got["keyboard/key_accuracy"] == pytest.approx(right / got["keyboard/sample_count"], abs=1e-12)
    assert got["duration_s"] == pytest.approx(sum(e - s for s, e in zip(starts, ends)) / 1e9, abs=1e-12)

    assert not any(k.startswith("d2e/") for k in OWAEventMetrics(tokenizer).compute())
    for bad in ({"bin_shifts": (1,)}, {"empty_bins_as_correct": True}, {"bin_ms": 0}, {"bin_ms": 50, "bin_shifts": 1.5},
                {"bin_ms": 50, "bin_shifts": (0.5,)}):
        with pytest.raises(ValueError, match="bin"):
            OWAEventMetrics(tokenizer, **bad)
