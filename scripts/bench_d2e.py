"""The D2E protocol in training (issues 31, 46): the update cost of ``bin_ms=50`` (and of 7 shifts), next to the
report without it (``bin_ms=None``), and its share of that update.

    python scripts/bench_d2e.py [--repeats 30]
    python scripts/bench_d2e.py --recording [--repeats 5]   # the MCAP route's binning of one 1-hour pair

The 32 sequences x 64 events generation batch of `bench_pairing`; under teacher forcing its true ids as the
argmax. 1 thread, medians of the CPU time of `OWAEventMetrics.update` (exact mode; with one thread, the wall time
on a quiet machine, and steady on a busy one), interleaved, per alignment and backend (``auto``: the compiled CPU
kernels; ``torch``: the ops a GPU runs). In generation ``bin_ms=50`` is the default (issue 46).

``--recording``: `owa_metrics.offline.d2e.pair_states` (the binning of the offline route, after the files' reading) on a
synthetic 1-hour pair of 200,000 raw mouse events (2 % with button bits) and 10,000 key events a side, with 1 and 7
shifts: median CPU ms, and the peak RSS of the process."""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import torch

from owa_metrics import OWAEventMetrics

from bench_pairing import setup  # scripts/ is on sys.path when run as a script


def recording(repeats: int) -> None:
    from owa_metrics.offline.d2e import pair_states
    from owa_metrics.events.d2e import D2ERecording

    rng, hour = np.random.default_rng(0), 3600 * 10**9

    def side(name: str) -> D2ERecording:
        m, k = 200_000, 10_000
        flags = np.where(rng.random(m) < 0.02, rng.choice([0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x400], m), 0)
        return D2ERecording(name, 0, 0, hour, np.sort(rng.integers(0, hour, k)), rng.integers(8, 120, k),
                            rng.integers(0, 2, k), np.sort(rng.integers(0, hour, m)), rng.integers(-20, 20, m),
                            rng.integers(-20, 20, m), flags, np.zeros(0, np.int64), np.zeros(0, np.int64))

    truth, pred = side("true"), side("pred")
    for shifts in ((), range(-3, 4)):
        times = []
        for _ in range(repeats + 1):  # the first (warm-up) dropped
            begin = time.process_time()
            pair_states(truth, pred, 50, shifts)
            times.append(time.process_time() - begin)
        print(f"pair_states, 1-hour pair, {len(shifts) or 1} shift(s): {1e3 * statistics.median(times[1:]):.0f} ms "
              f"(median of {repeats}, CPU)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--recording", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    known, _ = parser.parse_known_args()
    if known.recording:  # no training batch to build
        torch.set_num_threads(1)
        return recording(known.repeats)
    args, tokenizer, vocab, preds, target = setup(30)
    options = ({"bin_ms": None}, {"bin_ms": 50}, {"bin_ms": 50, "bin_shifts": range(-3, 4)})
    print("| alignment | backend | update ms, no D2E | bin_ms=50 (D2E's share) | with 7 shifts (share) |")
    print("|---|---|---:|---:|---:|")
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
            print(f"| {alignment} | {backend} | {ms[0]:.2f} | {ms[1]:.2f} ({ms[1] / ms[0] - 1:+.0%}) | "
                  f"{ms[2]:.2f} ({ms[2] / ms[0] - 1:+.0%}) |")


if __name__ == "__main__":
    main()
