"""Issue 31's budgets for `owa-metrics evaluate` at scale, side by side in one run (1 thread per process):

    python scripts/bench_scale.py [--mb 100 --out /tmp/owa_bench_scale] [--baseline /path/to/old/checkout]
    python scripts/bench_scale.py --processes [--mb 100] [--modes exact sketch] [--baseline CHECKOUT] [--repeats 5]
    python scripts/bench_scale.py --text --baseline /path/to/old/checkout [--repeats 5]  # only: token text, A/B


- token text: a prediction and a target JSONL file of ``--mb`` MB each (lines of 256 events of the three real
  recordings in ../shared/data, timestamps off by 0 / +10 / -20 ms), evaluated in-process: MB/s of the target file
  and of both files, by the wall clock and by this process's CPU time (the cores are shared: CPU time is what
  another process cannot take); the peak RSS of the whole command on 1/4 and all of the data (memory flat in the
  size); with ``--baseline``, an older checkout's ``evaluate()`` on the same files (CPU and wall, interleaved
  with this one's) and its command on 1/4 of the data.
- processes: ``torchrun --nproc-per-node 1`` and ``2`` alternately (``--repeats`` times on the token files in each of
  ``--modes``, ``--mcap-repeats`` times on 8 MCAP pairs; with ``--baseline``, that checkout's too, in the same
  alternation): each rank times its ``evaluate()`` after the imports and a warm-up (CPU time and wall, the slowest
  rank counts), and within it the report (the states' sync and ``compute()``, which the ranks share), and the
  whole command's wall time (imports and the warm-up included); MB/s and the 2-process ratio of each (of the
  medians; and the median of each repeat's own ratio, its 1-process run over the 2-process run right after). Then the
  machine's own ceiling for the same work: two 1-process runs whose timed parts start at the same moment (2 x one
  alone / the slower of the two).
- MCAP folders: ``--mb`` MB of uncompressed D2E MCAPs (mcap_owa's writer: the real recordings' events, their
  absolute mouse as ``mouse/raw`` differences, repeated and shifted in time; 4 distinct files of ~``--mb``/4 MB),
  read by the D2E route against iterating the same files with the ``mcap`` package's reader without decoding; the
  peak RSS on 2 and on 8 files (4 more copies: memory flat in the number of files).
- text (``--text``): only the token-text ``evaluate()`` of this tree and of ``--baseline``, each in its own process
  after a warm-up, alternately ``--repeats`` times (exact mode): each run's CPU and wall time, then the medians.
Generated data stays in ``--out`` (reused when present), out of git.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def token_files(out: Path, mb: float, lines_of: int = 256) -> tuple[Path, Path]:
    from owa_metrics import EventCodec
    from owa_metrics.events import read_recording

    pred, true = out / f"pred_{mb:g}.jsonl", out / f"true_{mb:g}.jsonl"
    if pred.exists() and true.exists():
        return pred, true
    codec, rng = EventCodec(), random.Random(0)
    events = [e for p in sorted(DATA.glob("*.mcap")) for e in read_recording(p)]
    size = 0
    with open(pred, "w") as fp, open(true, "w") as ft:
        while size < mb * 1e6:
            k = rng.randrange(len(events))
            chosen = [events[(k + i) % len(events)] for i in range(lines_of)]
            line = json.dumps({"text": "".join(map(codec.encode, chosen))}) + "\n"
            ft.write(line)
            fp.write(json.dumps({"text": "".join(codec.encode(dataclasses.replace(
                e, timestamp_ns=e.timestamp_ns + rng.choice([0, 0, 10_000_000, -20_000_000]))) for e in chosen)}) + "\n")
            size += len(line)
    return pred, true


def mcap_folders(out: Path, mb: float) -> tuple[Path, Path]:
    """4 distinct pairs (truth, a prediction with every mouse move off by one count) of ~mb/4 MB each."""
    from mcap.writer import CompressionType
    from mcap_owa.highlevel import OWAMcapWriter
    from owa.msgs.desktop.keyboard import KeyboardEvent
    from owa.msgs.desktop.mouse import RawMouseEvent
    from owa.msgs.desktop.screen import MediaRef, ScreenCaptured

    from owa_metrics.events import read_recording

    preds, truths = out / "mcap_pred", out / "mcap_true"
    if (truths / "rec3.mcap").exists():
        return preds, truths
    preds.mkdir(parents=True, exist_ok=True), truths.mkdir(parents=True, exist_ok=True)
    events, at = [], 0  # the recordings one after the other, 1 s apart (each from its own first event)
    for p in sorted(DATA.glob("*.mcap")):
        recorded = sorted(read_recording(p), key=lambda e: e.timestamp_ns)
        first = recorded[0].timestamp_ns
        events += [dataclasses.replace(e, timestamp_ns=e.timestamp_ns - first + at) for e in recorded]
        at = events[-1].timestamp_ns + 1_000_000_000
    t0, span = 0, at
    for k in range(4):
        for folder, off in ((truths, 0), (preds, 1)):
            path = folder / f"rec{k}.mcap"
            with OWAMcapWriter(str(path), compression=CompressionType.NONE) as writer:
                rep = 0
                while path.stat().st_size < mb / 4 * 1e6:
                    shift = rep * span + k * 7_000_000
                    for e in events:
                        t = e.timestamp_ns - t0 + shift + 1_000_000_000
                        if e.kind == "screen":
                            msg, topic = ScreenCaptured(utc_ns=t, media_ref=MediaRef(uri="v.mkv", pts_ns=t - 1_000_000_000),
                                                        source_shape=(8, 8), shape=(8, 8)), "screen"
                        elif e.kind == "keyboard":
                            msg, topic = KeyboardEvent(event_type=e.action, vk=e.vk), "keyboard"
                        else:
                            msg, topic = RawMouseEvent(last_x=e.dx + off * (e.button_flags == 0), last_y=e.dy,
                                                       button_flags=e.button_flags, button_data=0), "mouse/raw"
                        writer.write_message(msg, topic=topic, timestamp=int(t))
                    rep += 1
    return preds, truths


def peak_rss_mb(command: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, wall s) of a child command."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(),
                            start_new_session=True)  # torchrun signals its whole process group when it ends
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def _env(pythonpath: Path = ROOT) -> dict:
    return {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "owa_metrics", "evaluate", *args, "--no-progress"]


def timed(fn, *args, **kwargs):
    c, w = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - w, time.process_time() - c


def worker(pred: str, target: str, warm: list[str], mode: str) -> None:
    """One torchrun rank: its ``evaluate`` (token files, in ``mode``) or ``evaluate_d2e_folders`` (folders) timed
    after the imports and a warm-up on ``warm``; rank 0 prints every rank's (wall s, CPU s, the report's wall s) as
    JSON (the report: `owa_metrics.offline.evaluate.report_of`, the states' sync and ``compute()``; 0 for folders)."""
    import torch.distributed as dist

    from owa_metrics.offline import evaluate as module
    from owa_metrics.offline.d2e import evaluate_d2e_folders
    from owa_metrics.offline.evaluate import evaluate

    report_s = [0.0]

    def report_of(*args, **kwargs):  # timed where `evaluate` calls it
        begin = time.perf_counter()
        out = report_of.inner(*args, **kwargs)
        report_s[0] += time.perf_counter() - begin
        return out

    report_of.inner, module.report_of = module.report_of, report_of

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    folders = Path(pred).is_dir()
    run = (lambda p, t: evaluate_d2e_folders(p, t, 50, progress=False)) if folders else \
        (lambda p, t: evaluate(p, t, mode, progress=False))
    run(*warm)  # the kernels' cache load
    report_s[0] = 0.0
    time.sleep(max(0.0, float(os.environ.get("OWA_BENCH_START_AT", "0")) - time.time()))
    if world > 1:
        dist.barrier()
    _, wall, cpu = timed(run, pred, target)
    times = [None] * world
    if world > 1:
        dist.all_gather_object(times, (wall, cpu, report_s[0]))
        dist.destroy_process_group()
    else:
        times = [(wall, cpu, report_s[0])]
    if int(os.environ.get("RANK", "0")) == 0:
        print("TIMES " + json.dumps(times))


def _torchrun(n: int, pred: Path, target: Path, warm: tuple, tree: Path = ROOT, start_at: float = 0,
              mode: str = "exact"):
    """A started ``torchrun --nproc-per-node n`` of `worker` on ``tree``'s package (its timed part at ``start_at``)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
               str(Path(__file__).resolve()), "--worker", str(pred), str(target), str(warm[0]), str(warm[1]), mode]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**_env(tree), "OWA_BENCH_START_AT": str(start_at)})


def _times(proc) -> list:
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(proc.args)} failed: {err[-2000:]}")
    return json.loads(next(line for line in out.splitlines() if line.startswith("TIMES "))[6:])


def processes(pred: Path, target: Path, warm: tuple, what: str, repeats: int = 2, baseline: Path | None = None,
              mode: str = "exact") -> None:
    """1 and 2 torchrun processes alternately (this tree, and ``baseline``'s when given): each rank's evaluation
    (slowest rank), its report (sync and compute) and the whole command; then the machine's own ceiling, two
    1-process runs timed at once."""
    size = sum(f.stat().st_size for p in (pred, target) for f in ([p] if p.is_file() else p.glob("*.mcap"))) / 1e6
    trees = {"this tree": ROOT} | ({"baseline": baseline} if baseline else {})
    rows = {(name, n): [] for name in trees for n in (1, 2)}
    pairs = []
    for _ in range(repeats):
        for name, tree in trees.items():
            for n in (1, 2):
                start = time.perf_counter()
                times = _times(_torchrun(n, pred, target, warm, tree, mode=mode))
                rows[name, n].append([max(t[k] for t in times) for k in range(3)] + [time.perf_counter() - start])
        at = time.time() + 30  # both timed parts at once (imports and the warm-up take ~10-20 s)
        both = [_times(proc) for proc in [_torchrun(1, pred, target, warm, ROOT, at, mode) for _ in range(2)]]
        pairs.append(max(t[0] for times in both for t in times))
    med = {key: [sorted(x)[len(x) // 2] for x in zip(*r)] for key, r in rows.items()}
    for name, tree in trees.items():
        print(f"{what} ({name}: {tree}), {size:.0f} MB, median of {repeats} alternate runs | 1 process | 2 processes "
              f"| ratio")
        for k, label in enumerate(("evaluation, wall (slowest rank)", "evaluation, CPU (slowest rank)",
                                   "  of which the report (sync, compute)", "whole command, wall (+ imports, warm-up)")):
            one, two = med[name, 1][k], med[name, 2][k]
            if k == 2:  # the report's share of the evaluation (none for folders)
                if one:
                    print(f"  {label:40s} | {one:6.2f} s ({one / med[name, 1][0]:4.0%})   | {two:6.2f} s "
                          f"({two / med[name, 2][0]:4.0%})   |")
                continue
            print(f"  {label:40s} | {one:6.2f} s ({size / one:5.1f} MB/s) | {two:6.2f} s ({size / two:5.1f} MB/s) | "
                  f"{one / two:.2f}x")
        paired = sorted(a[0] / b[0] for a, b in zip(rows[name, 1], rows[name, 2]))
        print(f"  {'each repeat: 1 process / the 2 right after':40s} | median {paired[len(paired) // 2]:.2f}x, "
              f"{paired[0]:.2f}x to {paired[-1]:.2f}x")
    pair = sorted(pairs)[len(pairs) // 2]
    print(f"  the machine: two 1-process runs of this tree timed at once, the slower's wall {pair:.2f} s (median of "
          f"{repeats}): two processes' ceiling here 2 x {med['this tree', 1][0]:.2f} / {pair:.2f} = "
          f"{2 * med['this tree', 1][0] / pair:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--out", type=Path, default=Path("/tmp/owa_bench_scale"))
    parser.add_argument("--baseline", type=Path, help="an older checkout: its evaluate() on the same token files")
    parser.add_argument("--processes", action="store_true", help="only the 1 vs 2 processes figures")
    parser.add_argument("--text", action="store_true", help="only token text: this tree vs --baseline, alternately")
    parser.add_argument("--repeats", type=int, default=5, help="--text, --processes (token text): runs of each tree")
    parser.add_argument("--modes", nargs="+", default=["exact", "sketch"], help="--processes: token text's modes")
    parser.add_argument("--mcap-repeats", type=int, default=2, help="--processes: runs on the MCAP folders (0: none)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)  # one torchrun rank (see `worker`)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.worker[2:4], args.worker[4])
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {os.getloadavg()}")
    if args.text:
        return text_ab(args)
    if args.processes:
        small, (pred, true) = token_files(args.out, args.mb / 4), token_files(args.out, args.mb)
        for mode in args.modes:
            processes(pred, true, small, f"token text (JSONL), {mode}", args.repeats, args.baseline, mode)
        if args.mcap_repeats:
            many_p, many_t, two = mcap_copies(args.out, args.mb)
            processes(many_p, many_t, two, "MCAP folders (8 pairs)", args.mcap_repeats, args.baseline)
        print(f"load average at the end: {os.getloadavg()}")
        return
    from mcap.reader import make_reader

    from owa_metrics.offline.d2e import evaluate_d2e_folders
    from owa_metrics.offline.evaluate import evaluate

    small = token_files(args.out, args.mb / 4)
    pred, true = token_files(args.out, args.mb)
    mb_true, mb_both = true.stat().st_size / 1e6, (true.stat().st_size + pred.stat().st_size) / 1e6
    evaluate(small[0], small[1], progress=False)  # the kernels' compile / cache load, untimed
    for mode in ("exact", "sketch"):
        for _ in range(2 if args.baseline else 1):  # interleaved with the baseline's
            report, wall, cpu = timed(evaluate, pred, true, mode, progress=False)
            print(f"token text {mode:6s}: {mb_true:.0f} MB target + {mb_both - mb_true:.0f} MB prediction, "
                  f"{int(report['count/target_events']):,} events: wall {wall:.1f} s ({mb_true / wall:.0f} MB/s "
                  f"target, {mb_both / wall:.0f} MB/s both), CPU {cpu:.1f} s ({mb_true / cpu:.0f} / "
                  f"{mb_both / cpu:.0f} MB/s)")
            if args.baseline:
                wall, cpu = _baseline_evaluate(args.baseline, pred, true, mode, small)
                print(f"  baseline {args.baseline} {mode:6s}: wall {wall:.1f} s ({mb_both / wall:.0f} MB/s both), "
                      f"CPU {cpu:.1f} s ({mb_true / cpu:.0f} / {mb_both / cpu:.0f} MB/s)")
    for mode in ("exact", "sketch"):
        rss = [peak_rss_mb(cli("--pred", str(p), "--target", str(t), "--mode", mode)) for p, t in (small, (pred, true))]
        print(f"token text {mode:6s} command: peak RSS {rss[0][0]:.0f} MB at {args.mb / 4:g} MB, {rss[1][0]:.0f} MB at "
              f"{args.mb:g} MB; wall {rss[0][1]:.1f} s / {rss[1][1]:.1f} s")
    if args.baseline:
        rss, wall = _baseline(args.baseline, small)
        print(f"baseline {args.baseline}: {args.mb / 4:g} MB command: wall {wall:.1f} s "
              f"({small[1].stat().st_size / 1e6 / wall:.1f} MB/s target), peak RSS {rss:.0f} MB")
    processes(pred, true, small, "token text (JSONL)")

    preds, truths = mcap_folders(args.out, args.mb)
    files = sorted(truths.glob("*.mcap")) + sorted(preds.glob("*.mcap"))
    size = sum(f.stat().st_size for f in files) / 1e6

    def iterate() -> int:
        n = 0
        for path in files:
            with open(path, "rb") as f:
                for _ in make_reader(f).iter_messages():
                    n += 1
        return n

    for _ in range(2):
        count, raw_wall, raw_cpu = timed(iterate)
        report, wall, cpu = timed(evaluate_d2e_folders, preds, truths, 50, progress=False)
        print(f"MCAP folders: {len(files)} files, {size:.0f} MB, {count:,} messages: mcap reader without decoding wall "
              f"{raw_wall:.1f} s / CPU {raw_cpu:.1f} s; the D2E route wall {wall:.1f} s / CPU {cpu:.1f} s: "
              f"{wall / raw_wall:.2f}x / {cpu / raw_cpu:.2f}x ({int(report['d2e/num_bins']):,} bins)")
    many_p, many_t, two = mcap_copies(args.out, args.mb)
    rss = [peak_rss_mb(cli("--pred", str(p), "--target", str(t), "--bin-ms", "50")) for p, t in (two, (many_p, many_t))]
    print(f"MCAP folders command: peak RSS {rss[0][0]:.0f} MB on 2 pairs, {rss[1][0]:.0f} MB on 8 pairs")
    processes(many_p, many_t, two, "MCAP folders (8 pairs)")
    print(f"load average at the end: {os.getloadavg()}")


def text_ab(args) -> None:
    """This tree's and ``--baseline``'s token-text ``evaluate()`` (exact), alternately, each in its own process."""
    small, (pred, true) = token_files(args.out, args.mb / 4), token_files(args.out, args.mb)
    size = (pred.stat().st_size + true.stat().st_size) / 1e6
    trees = {"this tree": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
    times = {name: [] for name in trees}
    for k in range(args.repeats):
        for name, tree in trees.items():
            wall, cpu = _baseline_evaluate(tree, pred, true, "exact", small)
            times[name].append((wall, cpu))
            print(f"run {k + 1} {name:9s}: CPU {cpu:.2f} s ({size / cpu:.1f} MB/s), wall {wall:.2f} s, load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
    for name, rows in times.items():
        wall, cpu = (sorted(x)[len(x) // 2] for x in zip(*rows))
        print(f"{name} ({trees[name]}): {size:.0f} MB (both files), median of {args.repeats}: CPU {cpu:.2f} s "
              f"({size / cpu:.1f} MB/s), wall {wall:.2f} s ({size / wall:.1f} MB/s)")
    print(f"load average at the end: {os.getloadavg()}")


def mcap_copies(out: Path, mb: float) -> tuple[Path, Path, tuple[Path, Path]]:
    """The 4 MCAP pairs twice over (8 pairs: memory flat in the number of files), and 2 of them."""
    preds, truths = mcap_folders(out, mb)
    many_p, many_t = out / "mcap_pred_x2", out / "mcap_true_x2"
    for folder, copy in ((preds, many_p), (truths, many_t)):
        copy.mkdir(exist_ok=True)
        for f in folder.glob("*.mcap"):
            for k in range(2):
                if not (copy / f"{f.stem}_{k}.mcap").exists():
                    shutil.copy(f, copy / f"{f.stem}_{k}.mcap")
    two = out / "mcap_pred_2", out / "mcap_true_2"
    for folder, copy in zip((preds, truths), two):
        copy.mkdir(exist_ok=True)
        for f in sorted(folder.glob("*.mcap"))[:2]:
            if not (copy / f.name).exists():
                shutil.copy(f, copy / f.name)
    return many_p, many_t, two


def _baseline_evaluate(checkout: Path, pred: Path, true: Path, mode: str, warm) -> tuple[float, float]:
    """(wall s, CPU s) of an older checkout's ``evaluate()`` on the files, timed in its own process after a
    warm-up, as this one's."""
    code = (f"import time, torch; torch.set_num_threads(1)\nfrom owa_metrics.offline.evaluate import evaluate\n"
            f"evaluate({str(warm[0])!r}, {str(warm[1])!r}, progress=False)\n"
            f"c, w = time.process_time(), time.perf_counter()\n"
            f"evaluate({str(pred)!r}, {str(true)!r}, {mode!r}, progress=False)\n"
            f"print(time.perf_counter() - w, time.process_time() - c)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(checkout), cwd=checkout)
    if done.returncode:
        raise SystemExit(f"the baseline's evaluate failed: {done.stderr[-2000:]}")
    wall, cpu = map(float, done.stdout.split()[-2:])
    return wall, cpu


def _baseline(checkout: Path, files) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "owa_metrics", "evaluate", "--pred", str(files[0]), "--target",
                             str(files[1])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(checkout))
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024, time.perf_counter() - start


if __name__ == "__main__":
    main()
