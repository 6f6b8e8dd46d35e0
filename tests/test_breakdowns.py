"""Issue 25's breakdowns: detection over a tolerance sweep, keyboard events by key group and mouse events by
operation. Oracles: a separate single-tolerance metric at each t and the plain-Python time matching
(`matching_oracle.time_oracle`); plain Python over the event pairs for the groups, their ranges written from the
issue's text."""

import dataclasses
import json
import itertools

import numpy as np
import pytest
import torch

from owa_metrics import OWAEventMetrics, decode_batch
from owa_metrics.events import read_recording
from owa_metrics.functional.report import REPORT, unregister
from conftest import recording_paths
from matching_oracle import time_oracle
from metric_oracle import perturb
from test_pairing import _recording_batches, pad

SWEEP = (100, 12.5, 500, 50)  # the first pairs; not in order; one not whole
LABELS = ("100", "12.5", "500", "50")


@pytest.fixture(scope="module")
def sweep_run(tokenizer):
    """The recordings' batches with perturbed generated sides through the sweep metric (torch greedy matching) and
    one metric per tolerance (the CPU kernel's)."""
    rng = np.random.default_rng(11)
    sweep = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", tolerance_ms=SWEEP, backend="torch",
                            generated_screens="scored")
    singles = [OWAEventMetrics(tokenizer, alignment="generation", pairing="time", tolerance_ms=t, generated_screens="scored")
               for t in SWEEP]
    rows = {"preds": [], "targets": [], "origins": []}
    for preds, targets, origins in _recording_batches(sweep.vocab, rng)[::2]:
        for metric in [sweep, *singles]:
            metric.update(pad(preds), pad(targets), origin_ns=torch.tensor(origins))
        for key, part in zip(rows, (preds, targets, origins)):
            rows[key] += part
    return sweep.compute(), [m.compute() for m in singles], rows, sweep.vocab


def test_each_tolerance_of_a_sweep_equals_a_metric_at_that_tolerance(sweep_run):
    report, singles, rows, vocab = sweep_run
    f1 = []
    for t, label, single in zip(SWEEP, LABELS, singles):
        oracle = time_oracle(rows["preds"], rows["targets"], vocab, t, origins=rows["origins"])
        swept = {k[:-len(f"_within_{label}ms")]: float(v) for k, v in report.items() if k.endswith(f"_within_{label}ms")}
        names = {"detect/f1", "detect/precision", "detect/recall"} | {
            k for k in oracle if k.startswith("detect/") and k.endswith("/f1")}
        assert set(swept) == names, set(swept) ^ names
        for name, value in swept.items():
            assert value == float(single[name]), (t, name)  # exactly the single-tolerance report's
            assert abs(value - oracle[name]) <= 1e-12, (t, name)
        f1.append(oracle["detect/f1"])
    assert len(set(f1)) == len(f1) and 0 < min(f1)  # the tolerances do differ here
    assert abs(float(report["detect/f1_mean"]) - sum(f1) / len(f1)) <= 1e-12
    # every other key comes from the first tolerance: the single metric at 100 ms, no other key added
    first = singles[0]
    assert set(report) - set(first) == {k for k in report if "_within_" in k} | {"detect/f1_mean"}
    assert all(float(report[k]) == float(v) for k, v in first.items())
    assert not any("_within_" in k for single in singles for k in single)  # a number: today's keys only


def test_sweep_misuse_raises_saying_what_to_do(tokenizer):
    for bad in ((), (100, 100), (100, -5), (100, "50")):
        with pytest.raises(ValueError, match="tolerance_ms"):
            OWAEventMetrics(tokenizer, alignment="generation", pairing="time", tolerance_ms=bad)
    metric = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", tolerance_ms=[np.int64(50), 200])
    assert metric.tolerance_ms == (50, 200)  # numpy numbers are numbers
    ids = pad([[1, 2, 3]])
    with pytest.raises(ValueError, match="tolerance sweep"):
        metric.update(decode_batch(ids, ids, metric.vocab, "generation", pairing="time", tolerance_ms=50))
    metric.update(decode_batch(ids, ids, metric.vocab, "generation", pairing="time", tolerance_ms=(50, 200)))
    from owa_metrics.callbacks import OWAEventMetricsCallback  # the callback passes both on to its metrics

    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", pairing="time", tolerance_ms=(50, 200))
    assert callback.metric.shape.tolerances_ms == (50, 200)


# ------------------------------------------------------------------ key groups and mouse ops
GROUPS = {"letter": set(range(0x41, 0x5B)), "digit": set(range(0x30, 0x3A)) | set(range(0x60, 0x6A)),
          "modifier": {0x10, 0x11, 0x12, 0x5B, 0x5C, 0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5},
          "navigation": set(range(0x21, 0x29)), "editing": {0x08, 0x09, 0x0D, 0x1B, 0x20, 0x2D, 0x2E},
          "function": set(range(0x70, 0x88))}
OPS = {0x001: "left_down", 0x002: "left_up", 0x004: "right_down", 0x008: "right_up", 0x010: "middle_down",
       0x020: "middle_up", 0x400: "wheel", 0x800: "hwheel"}
# true keys and flags put on the recordings' events: each group's edges and their neighbours, several flags at once
TRUE_VKS = [0x41, 0x5A, 0x40, 0x5B, 0x30, 0x39, 0x60, 0x69, 0x6A, 0x10, 0x12, 0x13, 0x5C, 0x5D, 0xA0, 0xA5, 0xA6, 0x21,
            0x28, 0x29, 0x08, 0x09, 0x0D, 0x1B, 0x20, 0x2D, 0x2E, 0x2F, 0x70, 0x87, 0x88, 0x01, 0xFF]
TRUE_FLAGS = [*OPS, 0x003, 0x401, 0x040, 0x100]


def _with_keys_and_buttons(events, rng, vks, flags):
    """The recording's events, the keyboard events given the next key of ``vks`` (a cycle of `TRUE_VKS`), a third
    of the mouse events the next flags of ``flags``."""
    out = []
    for e in events:
        if e.kind == "keyboard":
            e = dataclasses.replace(e, vk=next(vks))
        elif e.kind == "mouse" and rng.random() < 0.3:
            e = dataclasses.replace(e, button_flags=next(flags))
        out.append(e)
    return out


def group_oracle(pairs):
    """Plain Python over (predicted, true) event pairs, all comparable."""
    right, count = {}, {}
    for p, t in pairs:
        if t.kind == "keyboard":
            name = "keyboard/" + next((g for g, vks in GROUPS.items() if t.vk in vks), "other")
            ok = p.vk == t.vk and p.action == t.action
        elif t.kind == "mouse" and t.button_flags:
            name, ok = "mouse_op/" + OPS.get(t.button_flags, "other"), p.button_flags == t.button_flags
        else:
            continue
        count[name], right[name] = count.get(name, 0) + 1, right.get(name, 0) + ok
    out = {f"{n}/count": float(c) for n, c in count.items()}
    out.update({f"{n}/accuracy": right[n] / c for n, c in count.items()})
    keyboard = [right[n] / c for n, c in count.items() if n.startswith("keyboard/")]
    out["keyboard/group_macro_accuracy"] = sum(keyboard) / len(keyboard)
    return out


@pytest.mark.parametrize("backend", ["kernel", "torch"])
def test_key_groups_and_mouse_ops_equal_the_oracle_on_recordings(format_vocab, backend):
    """Both formats, both accumulation paths, teacher forcing and generation: predictions that keep every event's
    token layout (wrong keys, actions and buttons), so that every event is comparable, position by position."""
    rng = np.random.default_rng(25)
    metrics = {alignment: OWAEventMetrics(vocab=format_vocab, alignment=alignment, backend=backend)
               for alignment in ("teacher_forcing", "generation")}
    saved = list(REPORT)
    try:  # the report without the key groups' definition
        unregister("key_groups")
        metrics["without"] = OWAEventMetrics(vocab=format_vocab, alignment="generation", backend=backend)
    finally:
        REPORT[:] = saved
    pairs, vks, flags = [], itertools.cycle(TRUE_VKS), itertools.cycle(TRUE_FLAGS)
    for path in recording_paths():
        events = _with_keys_and_buttons(read_recording(path, format_vocab.config.format), rng, vks, flags)
        chunks = [events[lo:lo + 120] for lo in range(0, len(events), 120)]
        for lo in range(0, len(chunks), 4):
            true = chunks[lo:lo + 4]
            pred = [perturb(c, rng, change_kinds=False) for c in true]
            pairs += [(p, t) for pc, tc in zip(pred, true) for p, t in zip(pc, tc)]
            preds, target = pad([format_vocab.encode(c) for c in pred]), pad(
                [format_vocab.encode(c, ignore_images=True) for c in true])
            for metric in metrics.values():
                metric.update(torch.where(target < 0, 0, preds), target)
    oracle = group_oracle(pairs)
    names = [f"keyboard/{g}" for g in (*GROUPS, "other")] + [f"mouse_op/{o}" for o in (*OPS.values(), "other")]
    assert all(oracle[f"{n}/count"] > 0 for n in names) and 0 < oracle["keyboard/group_macro_accuracy"] < 1
    without = metrics.pop("without").compute()
    for alignment, metric in metrics.items():
        report = metric.compute()
        if alignment == "generation":  # the rest of the report unchanged
            assert without and all(float(report[k]) == float(v) for k, v in without.items())
            assert not [k for k in without if "/left_down/" in k or "/letter/" in k]
        assert report["keyboard/count"] == sum(oracle[f"keyboard/{g}/count"] for g in (*GROUPS, "other"))
        bad = {k: (float(report[k]), v) for k, v in oracle.items() if abs(float(report[k]) - v) > 1e-12}
        assert not bad, (alignment, bad)
        assert {k for k in report if k.count("/") == 2 and k.startswith(("keyboard/", "mouse_op/"))
                and k.split("/")[1] != "timestamp"} == {k for k in oracle if k.count("/") == 2}


def test_key_groups_without_events(tokenizer):
    empty = OWAEventMetrics(tokenizer).compute()  # no events: counts 0, no accuracy, no macro
    assert float(empty["keyboard/letter/count"]) == 0 and "keyboard/letter/accuracy" not in empty
    assert "keyboard/group_macro_accuracy" not in empty


def test_the_cli_sweeps_and_groups(tmp_path, capsys):
    """``owa-metrics evaluate --tolerance-ms 50 100`` (with the key groups, on by default there): half the generated
    events 70 ms late, so that they match at 100 ms only; the plain-Python matching at each tolerance."""
    from owa_metrics import EventCodec, VocabMap, build_tokenizer
    from owa_metrics.cli import main
    from owa_metrics.offline.evaluate import tokenize

    events, codec = read_recording(recording_paths()[2]), EventCodec()  # 18 keyboard events in the first 80
    truth = "".join(map(codec.encode, events[:80]))
    guess = "".join(map(codec.encode, events[:40] + [dataclasses.replace(e, timestamp_ns=e.timestamp_ns + 70_000_000)
                                                     for e in events[40:80]]))
    (tmp_path / "true.txt").write_text(truth + "\n")
    (tmp_path / "pred.txt").write_text(guess + "\n")
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"), "--pairing",
                 "time", "--tolerance-ms", "50", "100", "--json", str(tmp_path / "out.json"), "--generated-screens",
                 "scored"]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "out.json").read_text())
    tokenizer = build_tokenizer()
    ids = [[tokenize(text, tokenizer.get_vocab(), tokenizer.unk_token_id)] for text in (guess, truth)]
    at = {t: time_oracle(*ids, VocabMap.from_tokenizer(tokenizer), tolerance_ms=t) for t in (50, 100)}
    assert at[50]["detect/f1"] < at[100]["detect/f1"] == 1
    for t, oracle in at.items():
        assert all(abs(report[f"{k}_within_{t}ms"] - v) <= 1e-12 for k, v in oracle.items()
                   if k.startswith("detect/") and k.endswith("f1"))
    assert abs(report["detect/f1"] - at[50]["detect/f1"]) <= 1e-12  # the first tolerance pairs
    assert abs(report["detect/f1_mean"] - (at[50]["detect/f1"] + at[100]["detect/f1"]) / 2) <= 1e-12
    keyboard = [e for e in events[:80] if e.kind == "keyboard"]
    assert report["keyboard/letter/count"] == sum(0x41 <= e.vk <= 0x5A for e in keyboard) > 0
