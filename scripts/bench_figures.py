"""What the callback's figures cost an epoch (issue 45): at the defaults, the timelines of the first 2 sequences.

    python scripts/bench_figures.py [--repeats 10] [--timeline-sequences 2] [--bin-shifts]

The demo's validation sequences (`owa_metrics.demo`, its default config: 256 tokens each), predicted as their own
labels moved by one event (every event decodes, so both sides draw in full: the most a figure holds). Timed, 1 thread,
the median over repeats of what `OWAEventMetricsCallback` adds at an epoch's end on rank zero: the timelines (and with
``--bin-shifts`` the latency curve) drawn and rendered to PNG once, logged to a TensorBoard run and written beside the
report; the sample table's decode of the kept sequences, which existed before, is timed apart. Wall time and this
process's CPU time (`time.process_time`: what the epoch pays when other jobs share the cores).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--timeline-sequences", type=int, default=2)
    parser.add_argument("--bin-shifts", action="store_true", help="bin_ms=50, bin_shifts=range(-3, 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from lightning.pytorch.loggers import TensorBoardLogger

    from owa_metrics import VocabMap, build_tokenizer
    from owa_metrics.callbacks import OWAEventMetricsCallback
    from owa_metrics.callbacks.artifacts import log_images, save_reports
    from owa_metrics.callbacks.lightning import _Run
    from owa_metrics.demo import DemoConfig, build_data
    from owa_metrics.tokens import collate

    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    _, val = build_data(DemoConfig(), vocab)
    batch = collate(val[:8])
    target = batch["labels"][:, 1:]
    preds = torch.roll(batch["labels"], 1, dims=1)[:, :-1]  # as the previous token: late by one event
    d2e = {"bin_ms": 50, "bin_shifts": range(-3, 4)} if args.bin_shifts else {}
    callback = OWAEventMetricsCallback(tokenizer, timeline_sequences=args.timeline_sequences, **d2e)
    run = _Run(callback.metric)
    run.metric.update(preds, target)
    report = {k: float(v) for k, v in run.metric.compute().items()}
    callback._keep(run, preds, target)
    with tempfile.TemporaryDirectory() as tmp:
        logger = TensorBoardLogger(tmp, name="bench")
        decode, figures, cpu = [], [], []
        for _ in range(args.repeats + 1):  # the first (warm-up: imports, numba, fonts) dropped
            begin = time.perf_counter()
            decoded = callback._decode_kept(run)
            middle, middle_cpu = time.perf_counter(), time.process_time()
            images = callback._figures(run, decoded, report, "epoch 0")
            log_images([logger], "val/owa/", "", images, 0)
            save_reports([logger], None, {f"epoch_0_step_0_{name}.png": png for name, png in images.items()})
            end, end_cpu = time.perf_counter(), time.process_time()
            decode.append(middle - begin)
            figures.append(end - middle)
            cpu.append(end_cpu - middle_cpu)
        logger.experiment.flush()
    ms = lambda x: 1e3 * statistics.median(x[1:])  # noqa: E731
    print("| timeline_sequences | bin_shifts | figures ms per epoch, wall | CPU | (the sample table's decode: ms) |")
    print("|---:|---|---:|---:|---:|")
    print(f"| {args.timeline_sequences} | {'-3..3' if args.bin_shifts else 'none'} | {ms(figures):.0f} | {ms(cpu):.0f} | "
          f"{ms(decode):.1f} |")


if __name__ == "__main__":
    main()
