"""Full update path (decode + every metric) vs an upstream-style per-event string path; compute() vs n.

    python scripts/bench_update.py update  [--repeats 10]     # 8 x 1024 and 32 x 2048 batches
    python scripts/bench_update.py compute [--sizes 10000 100000 1000000 --repeats 5]
    python scripts/bench_update.py loss    [--repeats 10]   # token_losses alone, narrow and wide vocabularies

``update``: `OWAEventMetrics.update` (teacher forcing, exact and sketch mode) on a simulated batch, next to
the reference that works the way the upstream OWA evaluator does: per target event, the tokenizer decodes
the predicted and the true span to strings, a regex splits them, the codec parses them, and a per-event
comparison record (timestamp, digit matches, mouse / keyboard fields) is appended to a Python list.
Label tokens/s count B x T positions. Medians, 1 thread; the compiled kernel (`backend="kernel"`) next to the torch ops, with logits and in generation,
and the token loss alone (`token_losses`: what logits add).

``compute`` (one thread): one IQM + bootstrap CI (B = 1000) over n float signed percent errors (all distinct)
in exact and sketch mode, the state bytes, and the reference's numpy IQM with a Python loop of 1000 resamples
(only up to 10^4: it is slow); then the whole `OWAEventMetrics.compute()` (7 CIs, every key) after updates
holding n target events of a simulated session whose predictions carry field errors (`field_error_batches`),
exact and sketch: median ms, the state bytes and the peak resident memory added during the first compute().
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import threading
import time

import numpy as np
import torch

from owa_metrics import EventCodec, EventDecodeError, OWAEventMetrics, SignedPercentError, build_tokenizer
from owa_metrics.events import simulate_session
from owa_metrics.functional.tokens import token_losses
from owa_metrics.metrics.shared_compute import Read
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
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread")
    print(f"{'batch':>10} {'path':<34} {'threads':>7} {'median ms':>10} {'tokens/s':>13} {'vs reference':>12}")
    for batch, seq_len in ((8, 1024), (32, 2048)):
        probe = OWAEventMetrics(tokenizer)
        preds, target = make_batch(probe.vocab, batch, seq_len)
        positions = target.numel()
        ref_s = timed(lambda: UpstreamStyleReference(tokenizer).update(preds, target), 3)
        print(f"{batch}x{seq_len:>5} {'upstream-style string path':<34} {'-':>7} {ref_s * 1e3:>10.1f} "
              f"{positions / ref_s:>13,.0f} {'1x':>12}")
        logits = torch.randn(*target.shape, len(tokenizer))
        cases = [(mode, backend, "teacher_forcing", False) for mode in ("exact", "sketch") for backend in ("torch", "kernel")]
        cases += [("exact", backend, "teacher_forcing", True) for backend in ("torch", "kernel")]
        cases += [("exact", backend, "generation", False) for backend in ("torch", "kernel")]
        for mode, backend, alignment, with_logits in cases:
            metric = OWAEventMetrics(tokenizer, mode=mode, backend=backend, alignment=alignment)
            args = (preds, target, logits) if with_logits else (preds, target)
            for _ in range(2):  # the kernel compiles (or loads numba's cache) here, outside the timing
                metric.update(*args)
            s = timed(lambda: metric.update(*args), repeats)
            extra = f", logits V={logits.shape[-1]}" if with_logits else (", generation" if alignment == "generation" else "")
            name = f"update ({mode}, {backend}{extra})"
            print(f"{batch}x{seq_len:>5} {name:<34} {1:>7} {s * 1e3:>10.2f} {positions / s:>13,.0f} {ref_s / s:>11.0f}x")
        s = timed(lambda: token_losses(logits, target), repeats)  # what logits add: the loss alone, as update runs it
        name = f"token_losses alone (V={logits.shape[-1]})"
        print(f"{batch}x{seq_len:>5} {name:<34} {1:>7} {s * 1e3:>10.2f} {positions / s:>13,.0f} {ref_s / s:>11.0f}x")


def timed_cpu(fn, repeats: int) -> tuple[float, float]:
    """Medians of the wall-clock and of the process's CPU seconds of ``fn`` (on a shared, loaded machine the CPU
    time of a one-thread call is the steadier of the two)."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), float(np.median(cpus))


def field_error_batches(vocab, n_events: int, batch: int = 32, seq_len: int = 2048, seed: int = 0):
    """(preds, target) teacher-forcing batches of a simulated session holding at least ``n_events`` target events,
    the predictions being the targets with field errors a trained model makes (not token noise): 20 % of the
    timestamps exact, the others off by a Laplace(4) number of 10 ms units, 3 % by up to +-3 s; 25 % of the mouse
    moves exact, the others off by 8 % (normal) and +-2 px; 10 % wrong keys, 5 % flipped actions."""
    rng = np.random.default_rng(seed)
    events = []
    while len(events) < n_events * 1.05:  # a few target events fall on batch edges
        events += simulate_session(600, seed=seed + len(events), start_ns=events[-1].timestamp_ns if events else 0,
                                   format=vocab.config.format)
    m = len(events)
    shift = np.where(rng.random(m) < 0.2, 0, np.round(rng.laplace(0, 4, m)))
    shift = np.where(rng.random(m) < 0.03, rng.integers(-300, 301, m), shift).astype(np.int64) * 10_000_000
    exact = rng.random(m) < 0.25
    scale, jitter = 1 + rng.normal(0, 0.08, (m, 2)), rng.integers(-2, 3, (m, 2))
    wrong_vk, flip, vk = rng.random(m) < 0.1, rng.random(m) < 0.05, rng.integers(0, 256, m)
    preds = []
    for i, e in enumerate(events):  # benchmark set-up, not timed
        change = {"timestamp_ns": max(0, e.timestamp_ns + int(shift[i]))}
        if e.kind == "mouse" and not exact[i]:
            change.update({axis: int(np.clip(round(v * scale[i, j]) + jitter[i, j], -2000, 1999))
                           for j, (axis, v) in enumerate((("dx", e.dx), ("dy", e.dy)))})
        elif e.kind == "keyboard":
            change.update(vk=int(vk[i]) if wrong_vk[i] else e.vk,
                          action=("press" if e.action == "release" else "release") if flip[i] else e.action)
        preds.append(dataclasses.replace(e, **change))
    target_ids = np.array(vocab.encode(events, ignore_images=True))
    pred_ids = np.array(vocab.encode(preds, ignore_images=True))
    starts = np.flatnonzero(target_ids == vocab.ids["<EVENT_START>"])
    rows, begin = [], 0
    for s, e in zip(starts, np.append(starts[1:], len(target_ids))):  # whole events per row of seq_len tokens
        if e - begin > seq_len:
            rows.append((begin, s))
            begin = s
    out = []
    for first in range(0, len(rows) - batch + 1, batch):
        shape = (batch, seq_len)
        p, t = torch.full(shape, -100), torch.full(shape, -100)
        for r, (b0, b1) in enumerate(rows[first:first + batch]):
            t[r, :b1 - b0] = torch.from_numpy(target_ids[b0:b1])
            p[r, :b1 - b0] = torch.from_numpy(pred_ids[b0:b1])
        out.append((p.clamp(min=0), t))
    return out


class PeakRss:
    """Peak resident memory above the level at entry, sampled every 0.5 ms by a thread (freed heap given back
    to the OS first, so the entry level is the live data)."""

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self._rss()
        self.peak, self.running = self.base, True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self._rss())
        self.extra = self.peak - self.base


def state_bytes(metric) -> int:
    parts = [t for v in metric.metric_state.values() for t in (v if isinstance(v, list) else [v])]
    return sum(t.numel() * t.element_size() for t in parts)


def bench_compute(sizes: list[int], repeats: int) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, 1 thread\nSignedPercentError: IQM + CI of n float errors (all distinct)")
    print(f"{'n':>9} {'mode':<10} {'compute ms':>11} {'cpu ms':>9} {'state bytes':>12}")
    for n in sizes:
        pred = torch.from_numpy(rng.normal(100, 30, n))
        true = torch.from_numpy(rng.normal(100, 25, n)).clamp(min=1)
        for mode in ("exact", "sketch"):
            metric = SignedPercentError(mode=mode)
            metric.update(pred, true)

            def run():
                metric._computed = None  # force a fresh compute (no cached result)
                metric.compute()

            s, cpu = timed_cpu(run, repeats if mode == "sketch" or n <= 10**5 else max(3, repeats // 2))
            print(f"{n:>9} {mode:<10} {s * 1e3:>11.1f} {cpu * 1e3:>9.1f} {state_bytes(metric):>12,}")
        if n <= 10**4:
            values = ((pred - true) / true * 100).numpy()
            s, cpu = timed_cpu(lambda: reference_iqm_ci(values), 1)
            print(f"{n:>9} {'reference':<10} {s * 1e3:>11.1f} {cpu * 1e3:>9.1f} {'-':>12}")

    tokenizer = build_tokenizer()
    vocab = OWAEventMetrics(tokenizer).vocab
    begin = time.perf_counter()
    batches = field_error_batches(vocab, max(sizes))
    print(f"\nOWAEventMetrics.compute() (7 bootstrap CIs, every key), predictions with field errors "
          f"({len(batches)} batches of 32 x 2048 made in {time.perf_counter() - begin:.0f} s):")
    print(f"{'events':>9} {'mode':<7} {'compute ms':>11} {'cpu ms':>9} {'state MB':>9} {'peak extra MB':>14} "
          f"{'extra / state':>13} {'distinct ts / pe_x / pe_y':>26}")
    for n in sizes:
        for mode in ("exact", "sketch"):
            metric = OWAEventMetrics(tokenizer, mode=mode)
            for preds, target in batches:
                metric.update(preds, target)
                if metric.events[0, 0] >= n:
                    break

            def run():
                metric._computed = None
                return metric.compute()

            with PeakRss() as memory:  # the first compute: it also merges the list states' pieces
                report = run()
            s, cpu = timed_cpu(run, repeats if mode == "sketch" or n <= 10**5 else max(3, repeats // 2))
            distinct = "-"
            if mode == "exact":
                read = Read(metric)
                distinct = " / ".join(str(read.samples(name, value).values.numel()) for name, value in
                                      (("timestamp", "signed_error_ms"), ("mouse", "signed_pe_x"), ("mouse", "signed_pe_y")))
            size = state_bytes(metric)
            print(f"{int(report['count/valid_target_events']):>9} {mode:<7} {s * 1e3:>11.1f} {cpu * 1e3:>9.1f} "
                  f"{size / 1e6:>9.1f} {memory.extra / 1e6:>14.1f} {memory.extra / size:>13.2f} {distinct:>26}")


def bench_loss(repeats: int) -> None:
    """`token_losses` (the CPU path update runs with logits) on float32 and bfloat16 logits of a narrow and a wide
    vocabulary: median ms and the peak resident memory added by the first call, at one thread."""
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread\n{'logits':>28} {'median ms':>10} {'cpu ms':>9} {'peak extra MB':>14} "
          f"{'logits MB':>10}")
    g = torch.Generator().manual_seed(0)
    for (batch, seq_len, vocab_size) in ((32, 2048, 272), (2, 512, 151_936)):
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(batch, seq_len, vocab_size, generator=g).to(dtype)
            target = torch.randint(0, vocab_size, (batch, seq_len), generator=g)
            with PeakRss() as memory:
                token_losses(logits, target)
            s, cpu = timed_cpu(lambda: token_losses(logits, target), repeats)
            name = f"{batch}x{seq_len} V={vocab_size} {str(dtype).removeprefix('torch.')}"
            print(f"{name:>28} {s * 1e3:>10.1f} {cpu * 1e3:>9.1f} {memory.extra / 1e6:>14.1f} "
                  f"{logits.numel() * logits.element_size() / 1e6:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["update", "compute", "loss"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    args = parser.parse_args()
    if args.what == "update":
        bench_update(args.repeats)
    elif args.what == "loss":
        bench_loss(args.repeats)
    else:
        bench_compute(args.sizes, args.repeats)


if __name__ == "__main__":
    main()
