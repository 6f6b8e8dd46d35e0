"""Issue 46 item 5: the D2E protocol on by default in generation (the paper's setting: ``bin_ms="auto"`` is 50
there), off under teacher forcing and with ``bin_ms=None``; on the compiled CPU path the bins come from one compiled
pass over the decoded arrays, equal to the torch ops."""

import dataclasses

import numpy as np
import pytest
import torch

from owa_metrics import OWAEventMetrics, decode_batch
from owa_metrics.callbacks import OWAEventMetricsCallback
from owa_metrics.events import simulate_session
from owa_metrics.functional.d2e import batch_states
from owa_metrics.schema import Event
from d2e_oracle import oracle_events
from test_d2e import _as_oracle_events, _same

MS = 1_000_000


def _pair(seed: int = 0):
    """A true row of moves, clicks and keys on the format's 10 ms grid, and its prediction 20 ms late with other
    dx, a click dropped and a key changed."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.choice(np.arange(100, 900), 60, replace=False)) * 10 * MS
    truth = []
    for i, t in enumerate(times.tolist()):
        if i % 4 == 0:
            truth.append(Event("keyboard", t, vk=65 + i % 3, action=("press", "release")[i // 4 % 2]))
        elif i % 7 == 0:
            truth.append(Event("mouse", t, dx=0, dy=0, button_flags=(1, 2)[i // 7 % 2]))
        else:
            truth.append(Event("mouse", t, dx=int(rng.integers(-30, 31)), dy=int(rng.integers(-20, 21))))
    pred = [dataclasses.replace(e, timestamp_ns=e.timestamp_ns + 20 * MS, vk=66 if i % 9 == 0 and e.vk else e.vk,
                                dx=None if e.dx is None else e.dx + int(rng.integers(-3, 4)))
            for i, e in enumerate(truth) if not (e.button_flags and i % 3 == 0)]
    return truth, pred


def _d2e(metric) -> dict:
    return {k[len("d2e/"):]: v.item() for k, v in metric.compute().items() if k.startswith("d2e/")}


def test_generation_scores_the_protocol_by_default_and_teacher_forcing_does_not(tokenizer, vocab):
    truth, pred = _pair()
    target, generated = torch.tensor([vocab.encode(truth)]), torch.tensor([vocab.encode(pred)])
    # the oracle: 50 ms bins over the row's range, its first to its last true event (docs/METRICS.md)
    want = oracle_events(_as_oracle_events(truth), _as_oracle_events(pred), truth[0].timestamp_ns,
                         truth[-1].timestamp_ns, 50)
    assert want["num_bins"] > 100 and want["mouse_move/sample_count"] > 20 and want["keyboard/sample_count"] > 10
    for pairing, backend in (("index", "auto"), ("index", "torch"), ("time", "auto")):
        metric = OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing, backend=backend)
        metric.update(generated, target)
        _same(_d2e(metric), want, 1e-12)
    shifted = OWAEventMetrics(tokenizer, alignment="generation", bin_shifts=(-2, 2))  # shifts need no bin_ms here
    shifted.update(generated, target)
    late = oracle_events(_as_oracle_events(truth), _as_oracle_events(pred), truth[0].timestamp_ns,
                         truth[-1].timestamp_ns, 50, shift=2)
    late.pop("duration_s")
    _same({k[:-len("_shift_2bins")]: v for k, v in _d2e(shifted).items() if k.endswith("_shift_2bins")}, late, 1e-12)

    off = OWAEventMetrics(tokenizer, alignment="generation", bin_ms=None)
    off.update(generated, target)
    assert _d2e(off) == {} and "comparable_rate" in off.compute()
    teacher = OWAEventMetrics(tokenizer)  # teacher forcing: off unless asked
    teacher.update(target, target)
    assert _d2e(teacher) == {}
    with pytest.raises(ValueError, match="bin_ms"):
        OWAEventMetrics(tokenizer, bin_shifts=(-1, 1))
    callbacks = [OWAEventMetricsCallback(tokenizer, alignment="generation"), OWAEventMetricsCallback(tokenizer),
                 OWAEventMetricsCallback(tokenizer, alignment="generation", bin_ms=None)]
    assert [c.metric.shape.bin_ms for c in callbacks] == [50, None, None]


def _noisy(ids: torch.Tensor, vocab, rng, rate: float) -> torch.Tensor:
    """``ids`` with a share of the tokens replaced by random ones (events that do not decode), padding kept."""
    noise = torch.from_numpy(rng.integers(0, vocab.size, ids.shape))
    return torch.where((torch.from_numpy(rng.random(ids.shape)) < rate) & (ids >= 0), noise, ids)


def _batches(vocab):
    """Generation and teacher-forcing batches: rows of a simulated session (some spanning several timestamp
    windows), predictions jittered, dropped and corrupted, a true row without any event and one whose events all
    fail to decode."""
    rng = np.random.default_rng(0)
    events = [e for e in simulate_session(240, seed=3) if e.kind != "screen"]
    rows = [events[40 * i:40 * (i + 1)] for i in range(8)]
    rows.append([dataclasses.replace(e, timestamp_ns=2_500 * MS * i) for i, e in enumerate(events[:30])])  # 75 s
    preds = [[dataclasses.replace(e, timestamp_ns=e.timestamp_ns + int(rng.integers(-8, 9)) * 10 * MS)
              for e in row if rng.random() > 0.1] for row in rows]
    pad = lambda seqs: torch.tensor([s + [-100] * (max(map(len, seqs)) - len(s)) for s in seqs])  # noqa: E731
    target = pad([vocab.encode(r) for r in rows] + [[], vocab.encode(rows[0])])
    target[-1, target[-1] >= 0] = vocab.size - 1  # no event of the last row decodes
    generated = _noisy(pad([vocab.encode(p) for p in preds] + [vocab.encode(rows[1]), vocab.encode(rows[2])]), vocab,
                       rng, 0.02)
    return {"generation": (generated, target), "teacher_forcing": (_noisy(target.clamp(min=0), vocab, rng, 0.05),
                                                                   target)}


def test_the_compiled_binning_equals_the_torch_ops(tokenizer, vocab):
    """`batch_states(compiled=True)` (one compiled pass from the decoded arrays) against the torch ops
    (`batch_events`, `d2e_states`) on both alignments, by group and at shifts; and the metric's D2E keys on the
    compiled path against its torch path, in generation with the defaults."""
    window = vocab.config.timestamp_window_ns
    for alignment, (preds, target) in _batches(vocab).items():
        batch = decode_batch(preds, target, vocab, alignment, backend="kernel")
        group = torch.arange(batch.num_sequences) % 3
        for shifts, grouping in (((), {}), ((-3, -1, 2), {}), ((-1, 1), {"group": group, "groups": 4})):
            compiled = batch_states(batch, window, 50, shifts, **grouping, compiled=True)
            torch_ops = batch_states(batch, window, 50, shifts, **grouping)
            assert torch.equal(compiled, torch_ops), (alignment, shifts, grouping)
        assert compiled[..., 0].sum() > 500  # bins compared
    preds, target = _batches(vocab)["generation"]
    metrics = [OWAEventMetrics(tokenizer, alignment="generation", backend=b) for b in ("kernel", "torch")]
    for metric in metrics:
        metric.update(preds, target)
    kernel, torch_path = (_d2e(m) for m in metrics)
    assert kernel["num_bins"] > 500
    _same(kernel, torch_path, 0)
