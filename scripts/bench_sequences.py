"""What a generated sequence does (issue 26): the update cost of its keys, next to the report without them.

    python scripts/bench_sequences.py [--repeats 30]

The 32 sequences x 64 events generation batch of `bench_pairing` (5 % dropped, half jittered, 5 % doubled). Timed,
1 thread, medians of `OWAEventMetrics.update` (exact mode) with the whole report and with the report less the
`SEQUENCES` and `MOVES_WITH_MISSES` definitions, per pairing and backend (``auto``: the compiled CPU kernels; ``torch``: the ops a GPU runs).
Both decoders decode every generated event once, paired or not (`EventBatch.generated`).
"""

from __future__ import annotations

import statistics
import time


from owa_metrics import OWAEventMetrics
from owa_metrics.functional import report

from bench_pairing import setup  # scripts/ is on sys.path when run as a script


def main() -> None:
    args, tokenizer, vocab, preds, target = setup(30)
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


if __name__ == "__main__":
    main()
