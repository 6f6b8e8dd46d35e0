"""Full update path (decode + every metric) vs an upstream-style per-event string path; compute() vs n.

    python scripts/bench_update.py update  [--repeats 10]     # 8 x 1024 and 32 x 2048 batches
    python scripts/bench_update.py compute [--sizes 10000 100000 1000000]

``update``: `OWAEventMetrics.update` (teacher forcing, exact and sketch mode) on a simulated batch, next to
the reference that works the way the upstream OWA evaluator does: per target event, the tokenizer decodes
the predicted and the true span to strings, a regex splits them, the codec parses them, and a per-event
comparison record (timestamp, digit matches, mouse / keyboard fields) is appended to a Python list.
Label tokens/s count B x T positions. Medians; threads 1 and the default.

``compute``: one IQM + bootstrap CI (B = 1000) over n signed errors in exact and sketch mode, the state
bytes, and the reference's numpy IQM with a Python loop of 1000 resamples (only up to 10^4: it is slow);
then the whole `OWAEventMetrics.compute()` after five 32 x 2048 updates.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from owa_metrics import EventCodec, EventDecodeError, OWAEventMetrics, SignedPercentError, build_tokenizer
from owa_metrics.metrics.per_event import compare_events

from bench_decode import make_batch, timed  # scripts/ is on sys.path when run as a script


class UpstreamStyleReference:
    """Per-event string path: tokenizer.decode each span, regex + parse, one comparison record per event
    (seed 004's per-event structure, built by `owa_metrics.metrics.per_event`), kept in Python lists."""

    def __init__(self, tokenizer):
        self.tokenizer, self.codec = tokenizer, EventCodec()
        self.records: list[dict] = []

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        for p_row, t_row in zip(preds.tolist(), target.tolist()):
            tokens = [self.tokenizer.convert_ids_to_tokens(i) if i >= 0 else None for i in t_row]
            for first, last, cut in self.codec.spans(tokens):
                head = "<EVENT_START>" if cut else ""
                t_ids = [i for i in t_row[first:last + 1] if i >= 0]
                p_ids = [p for p, t in zip(p_row[first:last + 1], t_row[first:last + 1]) if t >= 0]
                record = {"comparable": False}
                try:
                    truth = self.codec.decode(head + self.tokenizer.decode(t_ids))
                    pred = self.codec.decode(head + self.tokenizer.decode(p_ids))
                    if pred.kind == truth.kind:
                        record = {"comparable": True, **compare_events(self.codec, pred, truth)}
                except EventDecodeError:
                    pass
                self.records.append(record)


def reference_iqm_ci(values, resamples: int = 1000, seed: int = 42):
    """The upstream way: numpy IQM, and a Python loop over bootstrap resamples."""
    def iqm(x):
        q25, q75 = np.percentile(x, [25, 75])
        return x[(x >= q25) & (x <= q75)].mean()

    x = np.asarray(values)
    np.random.seed(seed)
    reps = [iqm(np.random.choice(x, size=x.size, replace=True)) for _ in range(resamples)]
    return iqm(x), np.percentile(reps, [2.5, 97.5])


def bench_update(repeats: int) -> None:
    tokenizer = build_tokenizer()
    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}")
    print(f"{'batch':>10} {'path':<34} {'threads':>7} {'median ms':>10} {'tokens/s':>13} {'vs reference':>12}")
    for batch, seq_len in ((8, 1024), (32, 2048)):
        probe = OWAEventMetrics(tokenizer)
        preds, target = make_batch(probe.vocab, batch, seq_len)
        positions = target.numel()
        ref_s = timed(lambda: UpstreamStyleReference(tokenizer).update(preds, target), 3)
        print(f"{batch}x{seq_len:>5} {'upstream-style string path':<34} {'-':>7} {ref_s * 1e3:>10.1f} "
              f"{positions / ref_s:>13,.0f} {'1x':>12}")
        default_threads = torch.get_num_threads()
        for mode in ("exact", "sketch"):
            for backend in ("torch", "kernel"):
                for threads in (1, default_threads):
                    torch.set_num_threads(threads)
                    metric = OWAEventMetrics(tokenizer, mode=mode, backend=backend)
                    for _ in range(2):  # the kernel compiles (or loads numba's cache) here, outside the timing
                        metric.update(preds, target)
                    s = timed(lambda: metric.update(preds, target), repeats)
                    name = f"update ({mode}, {backend})"
                    print(f"{batch}x{seq_len:>5} {name:<34} {threads:>7} {s * 1e3:>10.2f} "
                          f"{positions / s:>13,.0f} {ref_s / s:>11.0f}x")
        torch.set_num_threads(default_threads)


def bench_compute(sizes: list[int], repeats: int) -> None:
    rng = np.random.default_rng(0)
    print(f"{'n':>9} {'mode':<10} {'compute ms':>11} {'state bytes':>12}")
    for n in sizes:
        pred = torch.from_numpy(rng.normal(100, 30, n))
        true = torch.from_numpy(rng.normal(100, 25, n)).clamp(min=1)
        for mode in ("exact", "sketch"):
            metric = SignedPercentError(mode=mode)
            metric.update(pred, true)
            state = metric.signed_percent_errors
            nbytes = sum(t.numel() * t.element_size() for t in state) if isinstance(state, list) else state.numel() * 8

            def run():
                metric._computed = None  # force a fresh compute (no cached result)
                metric.compute()

            s = timed(run, repeats if mode == "sketch" or n <= 10**5 else 1)
            print(f"{n:>9} {mode:<10} {s * 1e3:>11.1f} {nbytes:>12,}")
        if n <= 10**4:
            values = ((pred - true) / true * 100).numpy()
            s = timed(lambda: reference_iqm_ci(values), 1)
            print(f"{n:>9} {'reference':<10} {s * 1e3:>11.1f} {'-':>12}")
    tokenizer = build_tokenizer()
    print("\nOWAEventMetrics.compute() after 5 updates of 32 x 2048 (7 bootstrap CIs, every key):")
    for mode in ("exact", "sketch"):
        metric = OWAEventMetrics(tokenizer, mode=mode)
        for seed in range(5):
            metric.update(*make_batch(metric.vocab, 32, 2048, seed=seed))

        def run():
            metric._computed = None
            return metric.compute()

        s = timed(run, 3)
        print(f"{mode:<7} {int(run()['count/valid_target_events']):>7} events {s * 1e3:>9.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["update", "compute"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    args = parser.parse_args()
    if args.what == "update":
        bench_update(args.repeats)
    else:
        bench_compute(args.sizes, args.repeats)


if __name__ == "__main__":
    main()
