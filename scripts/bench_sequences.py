"""What a generated sequence does (issue 26): the update cost of its keys, next to the report without them.

    python scripts/bench_sequences.py [--repeats 30]

The 32 sequences x 64 events generation batch of `bench_pairing` (5 % dropped, half jittered, 5 % doubled). Timed,
1 thread, medians of `OWAEventMetrics.update` (exact mode) with the whole report and with the report less the
`SEQUENCES` and `MOVES_WITH_MISSES` definitions, per pairing and backend (``auto``: the compiled CPU kernels, whose
index-pairing decode already yields every generated event; ``torch``: the ops a GPU runs, which decode the generated
side a second time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer, decode_batch
from owa_metrics.events import simulate_session
from owa_metrics.functional import report

from bench_decode import timed  # scripts/ is on sys.path when run as a script
from bench_pairing import batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    events = simulate_session(600, seed=2)
    preds, target = batch(vocab, [events[64 * i:64 * (i + 1)] for i in range(32)], np.random.default_rng(0))
    new = (report.SEQUENCES, report.MOVES_WITH_MISSES)
    print("| pairing | backend | update ms, whole report | without the new keys | the new keys |")
    print("|---|---|---|---|---|")
    for pairing in ("index", "time"):
        for backend in ("auto", "torch"):
            metrics = [OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing, backend=backend)]
            for d in new:
                report.unregister(d.name)
            metrics.append(OWAEventMetrics(tokenizer, alignment="generation", pairing=pairing, backend=backend))
            for d in new:
                report.register(d)
            times = [[], []]
            for _ in range(args.repeats + 1):  # interleaved, the first (warm-up: numba, caches) dropped
                for metric, kept in zip(metrics, times):
                    metric.reset()
                    begin = time.perf_counter()
                    metric.update(preds, target)
                    kept.append(time.perf_counter() - begin)
            whole, without = (1e3 * statistics.median(t[1:]) for t in times)
            print(f"| {pairing} | {backend} | {whole:.2f} | {without:.2f} | {whole - without:+.2f} |")
    # the torch decoder reads only the generated spans paired with target events: the new keys decode the generated
    # side a second time (the compiled decoder's pass gives every generated event)
    second = timed(lambda: decode_batch(preds, preds, vocab, "teacher_forcing", "torch"), args.repeats)
    print(f"\nthe generated side's second decode (index pairing, torch ops: in both of its columns): {1e3 * second:.2f} ms")


if __name__ == "__main__":
    main()
