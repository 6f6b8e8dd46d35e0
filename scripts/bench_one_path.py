"""Issue 23's size budget against its speed budget: the CPU update with the compiled accumulation, next to one torch
accumulation path everywhere (the compiled decoder, then the torch ops of `plan.accumulate` on its `EventBatch`).

    python scripts/bench_one_path.py [--repeats 15]

Teacher forcing, exact mode, 32 x 2048 (`bench_decode.make_batch`), 1 thread, medians, the cases alternating in one
run, beside the per-event string path (`bench_update.UpstreamStyleReference`). Dropping the compiled accumulation
(`functional/kernel.py`'s loop and `plan.program` / `compiled_tables`) is the one cut of the core large enough to
matter for the size budget; this measures what it would cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from owa_metrics import OWAEventMetrics, build_tokenizer, decode_batch
from owa_metrics.functional.tokens import event_token_stats
from owa_metrics.metrics.accumulation import accumulate_batch

from bench_decode import make_batch, timed  # scripts/ is on sys.path when run as a script
from bench_update import UpstreamStyleReference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    compiled, one_path = OWAEventMetrics(tokenizer), OWAEventMetrics(tokenizer)
    preds, target = make_batch(compiled.vocab, 32, 2048)

    def torch_accumulation():
        batch = decode_batch(preds, target, one_path.vocab, "teacher_forcing", "kernel")
        accumulate_batch(one_path, batch, event_token_stats(batch, preds, target, one_path.vocab.config, None, None))

    cases = {"compiled decode + compiled accumulation (today)": lambda: compiled.update(preds, target),
             "compiled decode + torch accumulation (one path)": torch_accumulation}
    times = {name: [] for name in cases}
    for _ in range(args.repeats + 1):  # alternating; the first round (numba, plans) dropped
        for name, fn in cases.items():
            begin = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - begin)
    reference = timed(lambda: UpstreamStyleReference(tokenizer).update(preds, target), 3)
    print(f"32 x 2048, 1 thread: per-event string path {1e3 * reference:.1f} ms")
    for name, kept in times.items():
        ms = 1e3 * statistics.median(kept[1:])
        print(f"{name:<50} {ms:6.2f} ms  {1e3 * reference / ms:5.0f}x the string path")


if __name__ == "__main__":
    main()
