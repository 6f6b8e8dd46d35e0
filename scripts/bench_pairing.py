"""Generation by time (issue 11): the cost of ``pairing="time"`` next to ``"index"``.

    python scripts/bench_pairing.py [--repeats 20]

Two generation batches from a simulated session: 32 sequences x 64 events, and one 2,000-event sequence
(offline evaluation of a recording). The generated side drops 5 % of the events, jitters half of them by up
to +/- 150 ms (so some go back in time) and adds a near-duplicate to 5 %. Timed, 1 thread, medians:
`decode_batch` alone (time pairing also with ``backend="torch"``: the torch ops that run on a GPU, whose
greedy choice is a fixed-shape loop over the rows' k-th events, deferred acceptance in rounds for rows of more than
256 events), and `OWAEventMetrics.update` (decode + every metric; index pairing runs the compiled
kernel, time pairing decodes each side and accumulates with torch ops), exact mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import torch

from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer, decode_batch
from owa_metrics.events import simulate_session

from bench_decode import timed  # scripts/ is on sys.path when run as a script


def generated(events, rng):
    out = []
    for e in events:
        if rng.random() < 0.05:
            continue
        if rng.random() < 0.5:
            e = dataclasses.replace(e, timestamp_ns=e.timestamp_ns + int(rng.integers(-15, 16)) * 10_000_000)
        out.append(e)
        if rng.random() < 0.05:
            out.append(dataclasses.replace(e, timestamp_ns=e.timestamp_ns + 20_000_000))
    return out


def setup(repeats: int) -> tuple:
    """The issue 25 / 26 benchmarks' start: ``--repeats`` (default ``repeats``) parsed, 1 thread, ``(args, tokenizer,
    vocab, preds, target)`` of a 32 sequences x 64 events generation batch of a simulated session."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=repeats)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    events = simulate_session(600, seed=2)
    return (args, tokenizer, vocab, *batch(vocab, [events[64 * i:64 * (i + 1)] for i in range(32)],
                                           np.random.default_rng(0)))


def batch(vocab, chunks, rng):
    preds = [vocab.encode(generated(c, rng)) for c in chunks]
    target = [vocab.encode(c, ignore_images=True) for c in chunks]
    pad = lambda rows: torch.tensor([r + [-100] * (max(map(len, rows)) - len(r)) for r in rows])  # noqa: E731
    return pad(preds), pad(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    events = simulate_session(600, seed=2)
    cases = {"32 x 64 events": batch(vocab, [events[64 * i:64 * (i + 1)] for i in range(32)], rng),
             "1 x 2,000 events": batch(vocab, [events[:2000]], rng)}
    print("| batch | tokens (pred / target) | decode index ms | decode time ms | decode time, torch ops ms "
          "| update index ms | update time ms |")
    print("|---|---|---|---|---|---|---|")
    for name, (preds, target) in cases.items():
        row = [name, f"{tuple(preds.shape)} / {tuple(target.shape)}"]
        for pairing, backend in (("index", "auto"), ("time", "auto"), ("time", "torch")):
            decode = lambda: decode_batch(preds, target, vocab, "generation", backend, pairing)  # noqa: E731
            decode()  # warm (numba, caches)
            row.append(timed(decode, args.repeats))
        for pairing in ("index", "time"):
            metric = OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing)
            metric.update(preds, target)

            def update():
                metric.reset()
                metric.update(preds, target)

            row.append(timed(update, args.repeats))
        print("| " + " | ".join(row[:2] + [f"{1e3 * t:.2f}" for t in row[2:]]) + " |")


if __name__ == "__main__":
    main()
