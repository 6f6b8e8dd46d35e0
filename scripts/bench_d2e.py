"""The D2E protocol in training (issue 31): the update cost of ``bin_ms=50`` (and of 7 shifts), next to the report
without it.

    python scripts/bench_d2e.py [--repeats 30]

The 32 sequences x 64 events generation batch of `bench_pairing`; under teacher forcing its true ids as the
argmax. 1 thread, medians of the CPU time of `OWAEventMetrics.update` (exact mode; with one thread, the wall time
on a quiet machine, and steady on a busy one), interleaved, per alignment and backend (``auto``: the compiled CPU
kernels; ``torch``: the ops a GPU runs)."""

from __future__ import annotations

import statistics
import time

from owa_metrics import OWAEventMetrics

from bench_pairing import setup  # scripts/ is on sys.path when run as a script


def main() -> None:
    args, tokenizer, vocab, preds, target = setup(30)
    options = ({}, {"bin_ms": 50}, {"bin_ms": 50, "bin_shifts": range(-3, 4)})
    print("| alignment | backend | update ms, no D2E | bin_ms=50 | with 7 shifts |")
    print("|---|---|---|---|---|")
    for alignment in ("generation", "teacher_forcing"):
        p = preds if alignment == "generation" else target.clamp(min=0)  # teacher forcing: the true ids as argmax
        for backend in ("auto", "torch"):
            metrics = [OWAEventMetrics(tokenizer, alignment=alignment, backend=backend, **o) for o in options]
            times = [[] for _ in metrics]
            for _ in range(args.repeats + 1):  # interleaved, the first (warm-up: numba, caches) dropped
                for metric, kept in zip(metrics, times):
                    metric.reset()
                    begin = time.process_time()
                    metric.update(p, target)
                    kept.append(time.process_time() - begin)
            ms = [1e3 * statistics.median(t[1:]) for t in times]
            print(f"| {alignment} | {backend} | {ms[0]:.2f} | {ms[1]:.2f} ({ms[1] - ms[0]:+.2f}) | "
                  f"{ms[2]:.2f} ({ms[2] - ms[0]:+.2f}) |")


if __name__ == "__main__":
    main()
