"""Issue 10: hostile input through update (with logits, mixed integer dtypes, both formats, alignments and pairings,
generated batches without an event) never raises, counts every target event once (against the string reference's
spans), skips exactly the unusable loss tokens (against numpy) and leaves no NaN in the report."""

import sys
from pathlib import Path

import io
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fuzz import run  # noqa: E402

from owa_metrics import OWAEventMetrics, decode_batch  # noqa: E402


def test_fuzzed_updates_never_raise_and_count_every_event_once():
    fuzzed = run(12_000, seed=1)  # 2,000 sequences per format and mode
    assert {(c["alignment"], c["pairing"]) for c in fuzzed} == {("teacher_forcing", "index"), ("generation", "index"),
                                                               ("generation", "time")}
    for counts in fuzzed:
        name = f"{counts['format']} {counts['alignment']} {counts['pairing']}"
        assert counts["exceptions"] == 0, name
        assert counts["target_events"] == counts["reference_events"] > 5_000, name
        assert counts["loss_skipped"] == counts["oracle_skipped"], name
        assert counts["nan_keys"] == 0, name
        if counts["alignment"] == "teacher_forcing":
            assert counts["oracle_skipped"] > 100, name


def test_small_and_unsigned_id_dtypes_decode_like_int64(tokenizer, vocab):
    ids = torch.tensor([vocab.encode(__import__("owa_metrics").events.simulate_session(2, seed=3))[:200]])
    want = decode_batch(ids, ids, vocab)
    for dtype in (torch.int32, torch.int16):
        got = decode_batch(ids.to(dtype), ids.to(dtype), vocab)
        assert torch.equal(got.status, want.status) and torch.equal(got.target.values, want.target.values)
    small = ids.clamp(max=255)
    assert torch.equal(decode_batch(small.to(torch.uint8), small.to(torch.uint8), vocab).target.values,
                       decode_batch(small, small, vocab).target.values)


def test_one_nan_logit_or_a_label_past_the_logits_costs_only_that_token(tokenizer, vocab):
    from owa_metrics.events import simulate_session

    ids = torch.tensor([vocab.encode(simulate_session(3, seed=4), ignore_images=True)[:400]])
    logits = torch.randn(1, ids.shape[1], vocab.size)
    clean = OWAEventMetrics(tokenizer)
    clean.update(ids.clamp(min=0), ids, logits=logits)
    labelled = (ids[0] >= 0).nonzero().squeeze(1)
    poisoned, target = logits.clone(), ids.clone().to(torch.int32)
    poisoned[0, labelled[5], 0] = float("nan")
    target[0, labelled[9]] = vocab.size + 7  # an id the logits do not cover
    dirty = OWAEventMetrics(tokenizer)
    dirty.update(ids.clamp(min=0), target, logits=poisoned)
    a, b = clean.compute(), dirty.compute()
    assert b["count/loss_skipped_tokens"] == 2 and a["count/loss_skipped_tokens"] == 0
    for key in [k for k in a if k.endswith("/loss_sum")]:
        assert key in b and float(b[key]) <= float(a[key])  # the rest of the loss stays
    with pytest.raises(ValueError, match="teacher forcing only"):
        OWAEventMetrics(tokenizer, alignment="generation").update(ids.clamp(min=0), ids, logits=logits)


@pytest.mark.parametrize("mode", ["exact", "sketch"])
def test_persistent_states_round_trip_through_torch_save(tokenizer, vocab, mode):
    from owa_metrics.events import simulate_session

    ids = torch.tensor([vocab.encode(simulate_session(3, seed=5))[:600]])
    noisy = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.05, 7, ids).clamp(min=0)
    metric = OWAEventMetrics(tokenizer, mode=mode, persistent=True)
    metric.update(noisy, ids)
    assert OWAEventMetrics(tokenizer).state_dict() == {}  # states are not saved unless asked
    buffer = io.BytesIO()
    torch.save(metric.state_dict(), buffer)
    buffer.seek(0)
    restored = OWAEventMetrics(tokenizer, mode=mode, persistent=True)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    restored.update(noisy, ids)  # a restored metric goes on counting from where it was
    metric.update(noisy, ids)
    want, got = metric.compute(), restored.compute()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert got["count/target_events"] > 0 and got["comparable_rate"] < 1


def test_an_epoch_without_batches_warns_nothing(tokenizer, recwarn):
    report = OWAEventMetrics(tokenizer).compute()
    assert report["count/target_events"] == 0 and report["status/invalid_target_rate"] == 0
    assert not [w for w in recwarn if "before the ``update``" in str(w.message)]
