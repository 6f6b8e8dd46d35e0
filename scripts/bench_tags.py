"""Slices (issues 25, 34): the cost of ``tags=`` (8 tags) next to no tags, today's tree next to a baseline tree.

    python scripts/bench_tags.py [--repeats 20] [--baseline /work/main] [--rounds 3]

32 sequences x 64 events from a simulated session (the generated side perturbed as in bench_pairing.py), one tag
per sequence (4 sequences of each of 8 tags). Timed on one thread, medians, each setting without and with tags
alternately: `OWAEventMetrics.update` (teacher forcing: the compiled CPU path, and the torch path; the D2E protocol
on, ``bin_ms=50``; generation by index and by time) and `compute()` after one update (exact and sketch: every tag's
report is computed, bootstrap CIs included). With ``--baseline`` each round runs this script once on the baseline's
package and once on this one's (separate processes, ``PYTHONPATH``), alternately, and prints the medians over the
rounds side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

TAGS = [f"tag{i}" for i in range(8)]
SETTINGS = (  # alignment, pairing, mode, backend, bin_ms
    ("teacher_forcing", "index", "exact", "auto", None),
    ("teacher_forcing", "index", "sketch", "auto", None),
    ("teacher_forcing", "index", "exact", "torch", None),
    ("teacher_forcing", "index", "exact", "auto", 50),
    ("generation", "index", "exact", "auto", None),
    ("generation", "time", "exact", "auto", None),
)


def name_of(setting) -> str:
    alignment, pairing, mode, backend, bin_ms = setting
    return ", ".join([alignment, pairing, mode, backend] + ([f"bin_ms={bin_ms}"] if bin_ms else []))


def state_bytes(metric) -> int:
    """The bytes of every state, lists of samples included."""
    parts = [t for v in metric.metric_state.values() for t in (v if isinstance(v, list) else [v])]
    return sum(t.numel() * t.element_size() for t in parts)


def measure(repeats: int) -> dict:
    """``{setting: [update ms, update with 8 tags ms, compute ms, compute with 8 tags ms, tagged state bytes]}``."""
    from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer
    from owa_metrics.events import simulate_session

    from bench_decode import timed  # scripts/ is on sys.path when run as a script
    from bench_pairing import batch

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    events = simulate_session(600, seed=2)
    preds, target = batch(vocab, [events[64 * i:64 * (i + 1)] for i in range(32)], np.random.default_rng(0))
    tags = torch.arange(32) % 8
    out = {}
    for setting in SETTINGS:
        alignment, pairing, mode, backend, bin_ms = setting
        p = target if alignment == "teacher_forcing" else preds  # teacher forcing: the true ids as the prediction
        metrics = [OWAEventMetrics(tokenizer, alignment=alignment, pairing=pairing, mode=mode, backend=backend,
                                   bin_ms=bin_ms, tags=t) for t in (None, TAGS)]
        kwargs = [{}, {"tags": tags}]
        for metric, kw in zip(metrics, kwargs):
            metric.update(p, target, **kw)  # warm
        updates = [[], []]
        for _ in range(repeats):  # alternately, so that a busy moment hits both
            for k, (metric, kw) in enumerate(zip(metrics, kwargs)):
                metric.reset()
                updates[k].append(timed(lambda: metric.update(p, target, **kw), 1))
        computes = [timed(metric.compute, max(3, repeats // 4)) for metric in metrics]
        out[name_of(setting)] = [1e3 * float(np.median(u)) for u in updates] + [1e3 * c for c in computes] + [
            state_bytes(metrics[1])]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--baseline", help="a tree whose package is the baseline (e.g. /work/main)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures of this process's package as JSON")
    args = parser.parse_args()
    if args.json or not args.baseline:
        figures = measure(args.repeats)
        if args.json:
            print(json.dumps(figures))
            return
        print("| setting | update ms | update, 8 tags ms | ratio | compute ms | compute, 8 tags ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, (u0, u8, c0, c8, _) in figures.items():
            print(f"| {name} | {u0:.2f} | {u8:.2f} | {u8 / u0:.2f} | {c0:.2f} | {c8:.2f} |")
        return
    here = Path(__file__).resolve().parents[1]
    trees = {"baseline": Path(args.baseline).resolve(), "this tree": here}
    runs = {name: [] for name in trees}
    for _ in range(args.rounds):  # alternately, so that a busy moment hits both
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree))
            done = subprocess.run([sys.executable, __file__, "--json", "--repeats", str(args.repeats)], env=env,
                                  capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    median = {name: {s: np.median([r[s] for r in rs], 0) for s in rs[0]} for name, rs in runs.items()}
    print(f"torch {torch.__version__}, 1 thread; medians of {args.rounds} rounds x {args.repeats} updates; "
          f"baseline {trees['baseline']}, this tree {here}\n")
    print("| setting | update ms | 8 tags: baseline ms (ratio) | 8 tags: this tree ms (ratio) | compute, 8 tags: "
          "baseline / this tree ms | tagged state bytes: baseline / this tree |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in median["this tree"]:
        b, t = median["baseline"][s], median["this tree"][s]
        print(f"| {s} | {b[0]:.2f} / {t[0]:.2f} | {b[1]:.2f} ({b[1] / b[0]:.2f}×) | {t[1]:.2f} (**{t[1] / t[0]:.2f}×**) "
              f"| {b[3]:.1f} / {t[3]:.1f} | {b[4]:,.0f} / {t[4]:,.0f} |")


if __name__ == "__main__":
    main()
