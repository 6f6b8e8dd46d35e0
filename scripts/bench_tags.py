"""Slices (issue 25): the cost of ``tags=`` (8 tags) next to no tags, and the state bytes per tag.

    python scripts/bench_tags.py [--repeats 20]

32 sequences x 64 events from a simulated session (the generated side perturbed as in bench_pairing.py), one tag
per sequence (4 sequences of each of 8 tags). Timed on one thread, medians, each setting without and with tags
alternately in one run: `OWAEventMetrics.update` (teacher forcing: the compiled CPU path; generation by index and by
time) and `compute()` after one update (exact and sketch: every tag's report is computed, bootstrap CIs included).
"""

from __future__ import annotations


import numpy as np
import torch

from owa_metrics import OWAEventMetrics

from bench_decode import timed  # scripts/ is on sys.path when run as a script
from bench_pairing import setup

TAGS = [f"tag{i}" for i in range(8)]


def state_bytes(metric: OWAEventMetrics, tag) -> int:
    """The bytes of one copy of the states (the pooled one: tag None), lists of samples included."""
    total = 0
    for name in metric._defaults:
        if name.endswith(f"@{tag}") if tag is not None else "@" not in name:
            value = getattr(metric, name)
            total += sum(v.numel() * v.element_size() for v in (value if isinstance(value, list) else [value]))
    return total


def main() -> None:
    args, tokenizer, vocab, preds, target = setup(20)
    tags = torch.arange(32) % 8
    print(f"batch: preds {tuple(preds.shape)}, target {tuple(target.shape)}, 8 tags x 4 sequences\n")
    print("| setting | update ms | update, 8 tags ms | ratio | compute ms | compute, 8 tags ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for alignment, pairing, mode in (("teacher_forcing", "index", "exact"), ("teacher_forcing", "index", "sketch"),
                                     ("generation", "index", "exact"), ("generation", "time", "exact")):
        p = target if alignment == "teacher_forcing" else preds  # teacher forcing: the true ids as the prediction
        metrics = [OWAEventMetrics(tokenizer, alignment=alignment, pairing=pairing, mode=mode, tags=t)
                   for t in (None, TAGS)]
        kwargs = [{}, {"tags": tags}]
        for metric, kw in zip(metrics, kwargs):
            metric.update(p, target, **kw)  # warm
        updates = [[], []]
        for _ in range(args.repeats):  # alternately, so that a busy moment hits both
            for k, (metric, kw) in enumerate(zip(metrics, kwargs)):
                metric.reset()
                updates[k].append(timed(lambda: metric.update(p, target, **kw), 1))
        computes = [timed(metric.compute, max(3, args.repeats // 4)) for metric in metrics]
        update_ms = [1e3 * float(np.median(u)) for u in updates]
        row = [update_ms[0], update_ms[1], update_ms[1] / update_ms[0], 1e3 * computes[0], 1e3 * computes[1]]
        print(f"| {alignment}, {pairing}, {mode} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
        if alignment == "generation" and pairing == "time":
            bytes_exact = state_bytes(metrics[1], 0)
    sketch = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", mode="sketch", tags=TAGS)
    exact = OWAEventMetrics(tokenizer, alignment="generation", pairing="time", mode="exact", tags=TAGS)
    print(f"\nstate bytes per tag (generation, time pairing: every state): sketch {state_bytes(sketch, 0):,}; exact "
          f"{state_bytes(exact, 0):,} empty, {bytes_exact:,} after the update (tag0: 4 sequences x 64 events)")


if __name__ == "__main__":
    main()
