import collections

import numpy as np
import torch

from owa_metrics import CodecConfig, Category, EventCodec, Status, align_teacher_forcing, decode_batch, reference_decode
from owa_metrics.events import read_recording
from conftest import recording_paths
from factorized_oracle import encode_factorized, normalized_factorized
from oracles import batch_rows, normalized

# from ../shared/data/README.md: (mouse clicks press+release, keyboard, screen, mouse moves)
EXPECTED = {"example.mcap": (6, 32, 590, 203), "0.4.2.mcap": (4, 24, 33, 546), "0.5.1.mcap": (2, 20, 17, 216)}


def test_recordings_hold_the_documented_events():
    for path in recording_paths():
        events = read_recording(path)
        counts = collections.Counter(e.category for e in events)
        assert (counts[Category.MOUSE_OP], counts[Category.KEYBOARD], counts[Category.SCREEN],
                counts[Category.MOUSE_NOP]) == EXPECTED[path.name]
        assert [e.timestamp_ns for e in events] == sorted(e.timestamp_ns for e in events)
        clicks = [e.button_flags for e in events if e.category == Category.MOUSE_OP]
        assert clicks == [1, 2] * (len(clicks) // 2)  # left down, left up


def test_every_recorded_event_round_trips(codec):
    factorized = EventCodec(CodecConfig.preset("factorized"))
    for path in recording_paths():
        for event in read_recording(path):
            assert codec.decode(codec.encode(event)) == normalized(event)
            assert factorized.decode(encode_factorized(event)) == normalized_factorized(event)


def test_batch_decoder_agrees_with_reference_on_recordings(format_vocab):
    vocab = format_vocab
    rng = np.random.default_rng(7)
    sequences, with_images = [], []  # labels (image tokens ignored), model inputs (image tokens)
    for path in recording_paths():
        events = read_recording(path, format=vocab.config.format)
        cuts = np.sort(rng.choice(np.arange(1, len(events)), size=5, replace=False))
        for chunk in np.split(np.arange(len(events)), cuts):
            sequences.append(vocab.encode([events[i] for i in chunk], ignore_images=True))
            with_images.append(vocab.encode([events[i] for i in chunk]))
    assert len({len(s) for s in sequences}) == len(sequences)  # all lengths differ: real padding
    width = max(len(s) for s in sequences)
    target = torch.tensor([s + [-100] * (width - len(s)) for s in sequences])
    structural = np.array(sorted(vocab.ids.values())[:7])  # start, end, types, press, release: early ends, cuts
    noise = torch.from_numpy(np.where(rng.random(target.shape) < 0.8, rng.integers(0, vocab.size, size=target.shape),
                                      rng.choice(structural, size=target.shape)))
    flip = torch.from_numpy(rng.random(target.shape) < 0.01)
    inputs = torch.tensor([s + [0] * (width - len(s)) for s in with_images])
    preds = torch.where(flip, noise, inputs)

    perfect = decode_batch(target.clamp(min=0), target, vocab)
    assert len(perfect) == sum(sum(EXPECTED[p.name]) for p in recording_paths())
    assert (perfect.status == Status.VALID).all()

    model_output = torch.roll(preds, -1, dims=1)  # HF: the output at t predicts the label at t + 1
    for p, t, alignment in [(preds, target, "teacher_forcing"),
                            (*align_teacher_forcing(model_output, target), "teacher_forcing"),
                            (preds, target, "generation")]:
        ref_p = [row[row != -100].tolist() if alignment == "generation" else row.tolist() for row in p]
        want = reference_decode(ref_p, [row.tolist() for row in t], vocab, alignment=alignment)
        for backend in ("kernel", "torch"):
            got = batch_rows(decode_batch(p, t, vocab, alignment=alignment, backend=backend))
            assert got == want, backend
        statuses = collections.Counter(r["status"] for r in got)
        assert statuses[Status.VALID] > 0.5 * len(got) and len(statuses) > 2
