"""`OWAEventMetrics.update` on a CUDA GPU: time, kernels launched, host syncs and memory, states checked.

    python scripts/bench_gpu.py [--repeats 50] [--vocab 151936] [--detail] [--only TEXT] [--quick]

Cases on `bench_decode.make_batch`'s batches (a simulated session, 5 % of the predicted tokens replaced):
32 x 2048 teacher forcing (exact, sketch, with logits of the tokenizer's V), generation paired by index and by
time; 8 x 8192 teacher forcing alone and with logits of ``--vocab`` columns (a Qwen-sized vocabulary: the
columns past the tokenizer are never a label) in bfloat16 and float32.

- ms: the median of ``--repeats`` updates, each timed on the host clock from a synchronized device to the end of
  ``torch.cuda.synchronize()`` after it (what a training loop waits); the CPU kernel (``backend="kernel"``,
  1 thread, this machine's CPU) on the same batch beside it.
- kernels: the CUDA kernels and copies `torch.profiler` sees in one update, ``kernel ms`` their summed device time
  (GPU ms well above it: the host's op launches are the cost); ops: its top-level ``aten::`` ops
  (`count_ops.top_level_ops`).
- syncs: the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` in one update (every call that makes the host
  wait for the device), and `count_ops.SyncCounter`'s count, the CPU-side measure of the same thing.
- peak MB: the device memory the update allocates above what was allocated before it.
- check: every state after two updates against the CPU kernel (torch ops on the CPU for time pairing) fed the
  same batches, the logits as float32 (counts exact; float states to 1e-12 relative, the token losses, float32
  cross-entropies summed in another order, to 1e-5), then every key of ``compute()`` (loss keys to 1e-5 relative, the
  others to 1e-9); with the wide logits on their first two rows.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from owa_metrics import OWAEventMetrics, build_tokenizer

from bench_decode import make_batch, timed  # scripts/ is on sys.path when run as a script
from count_ops import SyncCounter, top_level_ops

CUDA = torch.device("cuda")


def gpu_timed(fn, repeats: int) -> float:
    """Median seconds of ``fn`` from a synchronized device to the end of its work."""
    def run():
        fn()
        torch.cuda.synchronize()
    torch.cuda.synchronize()
    return timed(run, repeats)


def kernels(fn) -> tuple[int, float, str]:
    """(kernels and copies, their summed device ms, the longest kernels and host ops) of one call of ``fn``."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    on_gpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: -e.self_device_time_total)
    on_host = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                     key=lambda e: -e.self_cpu_time_total)
    top = (", ".join(f"{e.key[:40]} x{e.count} {e.self_device_time_total / 1e3:.2f}" for e in on_gpu[:5])
           + "\n    longest host ops (ms): "
           + ", ".join(f"{e.key[:30]} x{e.count} {e.self_cpu_time_total / 1e3:.2f}" for e in on_host[:6]))
    return sum(e.count for e in on_gpu), sum(e.self_device_time_total for e in on_gpu) / 1e3, top


def host_waits(fn) -> list[str]:
    """Where (the innermost owa_metrics line) each call in ``fn`` that made the host wait for the device was made."""
    torch.cuda.synchronize()
    where = []

    def seen(message, *args, **kwargs):
        if "called a synchronizing" in str(message):
            ours = [f for f in traceback.extract_stack() if "owa_metrics" in f.filename]
            where.append(f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return where


def peak_mb(fn) -> float:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def states(metric) -> dict[str, torch.Tensor]:
    out = {}
    for name in metric._defaults:
        value = getattr(metric, name)
        if isinstance(value, list):
            value = torch.cat(value) if value else torch.zeros(0)
        out[name] = torch.as_tensor(value).detach().cpu().double()
    return out


def worst_state(gpu, cpu) -> str:
    """The state furthest from the CPU kernel's, by relative difference beyond its tolerance ('ok' if none)."""
    a, b = states(gpu), states(cpu)
    worst = (0.0, "ok")
    for name in a:
        if a[name].shape != b[name].shape:
            return f"{name}: shape {tuple(a[name].shape)} vs {tuple(b[name].shape)}"
        both_nan = a[name].isnan() & b[name].isnan()
        diff = torch.where(both_nan, 0.0, (a[name] - b[name]).abs() / b[name].abs().clamp(min=1e-300))
        diff = diff.nan_to_num(nan=float("inf"))
        tolerance = 1e-5 if name == "token_loss" else 1e-12
        top = float(diff.max()) if diff.numel() else 0.0
        if top > tolerance and top > worst[0]:
            worst = (top, f"{name}: {top:.1e} > {tolerance:.0e}")
    return worst[1]


def check(tokenizer, options, args_gpu, rows: int) -> str:
    """Two updates of the GPU metric and of the CPU kernel on the first ``rows`` rows: `worst_state`."""
    part = tuple(a[:rows] for a in args_gpu)
    gpu = OWAEventMetrics(tokenizer, backend="torch", **options).to(CUDA)
    cpu = OWAEventMetrics(tokenizer, backend="auto", **options)  # the kernel, or torch ops where it has none
    on_cpu = tuple(a.cpu().float() if a.is_floating_point() else a.cpu() for a in part)
    for _ in range(2):
        gpu.update(*part)
        cpu.update(*on_cpu)
    return f"{worst_state(gpu, cpu)}; compute(): {worst_key(gpu.compute(), cpu.compute())}"


def worst_key(got: dict, want: dict) -> str:
    """The report key furthest from the CPU kernel's (loss keys to 1e-5 relative, the others to 1e-9)."""
    if set(got) != set(want):
        return f"keys differ: {sorted(set(got) ^ set(want))[:4]}"
    worst = (0.0, "ok")
    for key, value in want.items():
        a, b = float(got[key]), float(value)
        diff = abs(a - b) / max(abs(b), 1e-300)
        tolerance = 1e-5 if "loss" in key else 1e-9
        if diff > tolerance and diff > worst[0]:
            worst = (diff, f"{key}: {a:.6g} vs {b:.6g}")
    return worst[1]


def run_case(tokenizer, name, options, batch, seq_len, vocab_cols, dtype, repeats, detail, quick):
    preds, target = make_batch(OWAEventMetrics(tokenizer).vocab, batch, seq_len)
    args_gpu = (preds.to(CUDA), target.to(CUDA))
    if vocab_cols:
        g = torch.Generator(device=CUDA).manual_seed(0)
        args_gpu += (torch.randn(*target.shape, vocab_cols, device=CUDA, dtype=dtype, generator=g),)
    metric = OWAEventMetrics(tokenizer, backend="torch", **options).to(CUDA)
    update = partial(metric.update, *args_gpu)
    try:
        update()
        gpu_s = gpu_timed(update, repeats)
        ops, waits, (launches, device_ms, top), peak = (top_level_ops(update), host_waits(update), kernels(update),
                                                        peak_mb(update))
        with SyncCounter() as counter:
            update()
        del metric, update  # the states freed before the next case
        verdict = "-" if quick else check(tokenizer, options, args_gpu, batch if vocab_cols < 1000 else 2)
    except torch.OutOfMemoryError as error:
        print(f"{batch}x{seq_len:<5} {name:<34} out of memory: {str(error).splitlines()[0][:90]}")
        return
    finally:
        torch.cuda.empty_cache()
    cpu_ms = "-"
    if vocab_cols < 1000 and not quick:
        cpu_metric = OWAEventMetrics(tokenizer, backend="auto", **options)
        args_cpu = tuple(a.cpu() for a in args_gpu)
        cpu_metric.update(*args_cpu)
        cpu_ms = f"{timed(lambda: cpu_metric.update(*args_cpu), max(5, repeats // 5)) * 1e3:.2f}"
    print(f"{batch}x{seq_len:<5} {name:<34} {gpu_s * 1e3:>8.2f} {device_ms:>9.2f} {cpu_ms:>8} {sum(ops.values()):>5} "
          f"{launches:>7} {len(waits):>5} {counter.total:>6} {peak:>8.0f}  {verdict}")
    if detail:
        print(f"    waits: {dict(Counter(waits))}\n    longest kernels (ms): {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--detail", action="store_true", help="where the host waits, and the longest kernels")
    parser.add_argument("--only", default="", help="run the cases whose name holds this text")
    parser.add_argument("--quick", action="store_true", help="GPU figures alone: no check, no CPU kernel timing")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, CPU kernel on 1 thread; "
          f"tokenizer V = {len(tokenizer)}")
    print(f"{'batch':<10} {'case':<34} {'GPU ms':>8} {'kernel ms':>9} {'CPU ms':>8} {'ops':>5} {'kernels':>7} "
          f"{'waits':>5} {'syncs':>6} {'peak MB':>8}  check")
    V = len(tokenizer)
    cases = [("teacher forcing, exact", {}, 32, 2048, 0, None),
             ("teacher forcing, sketch", {"mode": "sketch"}, 32, 2048, 0, None),
             (f"teacher forcing, logits V={V} f32", {}, 32, 2048, V, torch.float32),
             ("generation, index", {"alignment": "generation"}, 32, 2048, 0, None),
             ("generation, time", {"alignment": "generation", "pairing": "time"}, 32, 2048, 0, None),
             ("teacher forcing, D2E bins, 7 shifts", {"bin_ms": 50, "bin_shifts": range(-3, 4)}, 32, 2048, 0, None),
             ("generation, time, D2E bins", {"alignment": "generation", "pairing": "time", "bin_ms": 50}, 32, 2048, 0,
              None),
             ("teacher forcing, exact", {}, 8, 8192, 0, None),
             (f"teacher forcing, logits V={args.vocab} bf16", {}, 8, 8192, args.vocab, torch.bfloat16),
             (f"teacher forcing, logits V={args.vocab} f32", {}, 8, 8192, args.vocab, torch.float32)]
    for name, options, batch, seq_len, cols, dtype in (c for c in cases if args.only in c[0]):
        begin = time.perf_counter()
        run_case(tokenizer, name, options, batch, seq_len, cols, dtype, args.repeats, args.detail, args.quick)
        print(f"    ({time.perf_counter() - begin:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
