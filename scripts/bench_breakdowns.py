"""Issue 25's breakdowns: the update cost of a 4-tolerance sweep and of the key groups, next to without.

    python scripts/bench_breakdowns.py [--repeats 20]

One generation batch of 32 sequences x 64 events (`bench_pairing`'s: 5 % dropped, half jittered by up to
+/- 150 ms, 5 % near-duplicates), 1 thread, medians of `OWAEventMetrics.update` (exact mode), each row's cases timed
in the same run: time pairing with ``tolerance_ms=100`` and ``(50, 100, 200, 500)``; index pairing (generation)
and teacher forcing without and with the key groups (`report.KEY_GROUPS` unregistered, then back in its place), on
the compiled CPU path and the torch path (with the torch ops per update, `count_ops`).
"""

from __future__ import annotations


import torch

from owa_metrics import OWAEventMetrics
from owa_metrics.functional import report

from bench_decode import timed  # scripts/ is on sys.path when run as a script
from bench_pairing import setup
from count_ops import top_level_ops


def main() -> None:
    args, tokenizer, vocab, preds, target = setup(20)
    aligned = target.clamp(min=0)  # teacher forcing: the target's own tokens

    def cost(options: dict, p, t, ops: bool = False, groups: bool = True) -> str:
        saved = list(report.REPORT)
        if not groups:
            report.unregister("key_groups")
        metric = OWAEventMetrics(tokenizer, **options)
        report.REPORT[:] = saved
        metric.update(p, t)  # warm (numba, plans)

        def update():
            metric.reset()
            metric.update(p, t)

        text = f"{1e3 * timed(update, args.repeats):.2f}"
        return text + (f" ({sum(top_level_ops(update).values())} ops)" if ops else "")

    print(f"torch {torch.__version__}, 32 x 64 events, 1 thread, median of {args.repeats}")
    print("| update | without | with |")
    print("|---|---:|---:|")
    time = {"alignment": "generation", "pairing": "time"}
    print(f"| time pairing: tolerance_ms 100 / (50, 100, 200, 500) | {cost({**time, 'tolerance_ms': 100}, preds, target)}"
          f" | {cost({**time, 'tolerance_ms': (50, 100, 200, 500)}, preds, target)} |")
    for name, options, p in (("generation (index)", {"alignment": "generation"}, preds),
                             ("teacher forcing", {}, aligned)):
        for backend in ("kernel", "torch"):
            ops = backend == "torch"
            row = [cost({**options, "backend": backend}, p, target, ops, groups) for groups in (False, True)]
            print(f"| {name}, {backend}: key groups | {row[0]} | {row[1]} |")


if __name__ == "__main__":
    main()
