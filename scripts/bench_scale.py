"""Issue 31's budgets for `owa-metrics evaluate` at scale, side by side in one run (1 thread per process):

    python scripts/bench_scale.py [--mb 100 --out /tmp/owa_bench_scale] [--baseline /path/to/old/checkout]

- token text: a prediction and a target JSONL file of ``--mb`` MB each (lines of 256 events of the three real
  recordings in ../shared/data, timestamps off by 0 / +10 / -20 ms), evaluated in-process: MB/s of the target file
  and of both files, by the wall clock and by this process's CPU time (the cores are shared: CPU time is what
  another process cannot take); the peak RSS of the whole command on 1/4 and all of the data (memory flat in the
  size); one and two processes (torchrun) on the whole command; with ``--baseline``, the command from an older
  checkout on 1/4 of the data.
- MCAP folders: ``--mb`` MB of uncompressed D2E MCAPs (mcap_owa's writer: the real recordings' events, their
  absolute mouse as ``mouse/raw`` differences, repeated and shifted in time; 4 distinct files of ~``--mb``/4 MB),
  read by the D2E route against iterating the same files with the ``mcap`` package's reader without decoding; the
  peak RSS on 2 and on 8 files (4 more copies: memory flat in the number of files).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--out", type=Path, default=Path("/tmp/owa_bench_scale"))
    parser.add_argument("--baseline", type=Path, help="an older checkout: its command on 1/4 of the token data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {os.getloadavg()}")
    from mcap.reader import make_reader

    from owa_metrics.d2e import evaluate_d2e_folders
    from owa_metrics.evaluate import evaluate

    small = token_files(args.out, args.mb / 4)
    pred, true = token_files(args.out, args.mb)
    mb_true, mb_both = true.stat().st_size / 1e6, (true.stat().st_size + pred.stat().st_size) / 1e6
    evaluate(small[0], small[1], progress=False)  # the kernels' compile / cache load, untimed
    for mode in ("exact", "sketch"):
        report, wall, cpu = timed(evaluate, pred, true, mode, progress=False)
        print(f"token text {mode:6s}: {mb_true:.0f} MB target + {mb_both - mb_true:.0f} MB prediction, "
              f"{int(report['count/target_events']):,} events: wall {wall:.1f} s ({mb_true / wall:.0f} MB/s target, "
              f"{mb_both / wall:.0f} MB/s both), CPU {cpu:.1f} s ({mb_true / cpu:.0f} / {mb_both / cpu:.0f} MB/s)")
    for mode in ("exact", "sketch"):
        rss = [peak_rss_mb(cli("--pred", str(p), "--target", str(t), "--mode", mode)) for p, t in (small, (pred, true))]
        print(f"token text {mode:6s} command: peak RSS {rss[0][0]:.0f} MB at {args.mb / 4:g} MB, {rss[1][0]:.0f} MB at "
              f"{args.mb:g} MB; wall {rss[0][1]:.1f} s / {rss[1][1]:.1f} s")
    if args.baseline:
        rss, wall = _baseline(args.baseline, small)
        print(f"baseline {args.baseline}: {args.mb / 4:g} MB command: wall {wall:.1f} s "
              f"({small[1].stat().st_size / 1e6 / wall:.1f} MB/s target), peak RSS {rss:.0f} MB")
    for n in (1, 2):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), "-m",
                   "owa_metrics", "evaluate", "--pred", str(pred), "--target", str(true), "--no-progress"]
        _, wall = peak_rss_mb(command)
        print(f"token text, {n} process(es) (torchrun, the whole command): wall {wall:.1f} s")

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
    many_p, many_t = args.out / "mcap_pred_x2", args.out / "mcap_true_x2"
    for folder, copy in ((preds, many_p), (truths, many_t)):
        copy.mkdir(exist_ok=True)
        for f in folder.glob("*.mcap"):
            for k in range(2):
                if not (copy / f"{f.stem}_{k}.mcap").exists():
                    shutil.copy(f, copy / f"{f.stem}_{k}.mcap")
    two = args.out / "mcap_pred_2", args.out / "mcap_true_2"
    for folder, copy in zip((preds, truths), two):
        copy.mkdir(exist_ok=True)
        for f in sorted(folder.glob("*.mcap"))[:2]:
            if not (copy / f.name).exists():
                shutil.copy(f, copy / f.name)
    rss = [peak_rss_mb(cli("--pred", str(p), "--target", str(t), "--bin-ms", "50")) for p, t in (two, (many_p, many_t))]
    print(f"MCAP folders command: peak RSS {rss[0][0]:.0f} MB on 2 pairs, {rss[1][0]:.0f} MB on 8 pairs")
    for n in (1, 2):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), "-m",
                   "owa_metrics", "evaluate", "--pred", str(many_p), "--target", str(many_t), "--bin-ms", "50",
                   "--no-progress"]
        _, wall = peak_rss_mb(command)
        print(f"MCAP folders, 8 pairs, {n} process(es) (torchrun, the whole command): wall {wall:.1f} s")
    print(f"load average at the end: {os.getloadavg()}")


def _baseline(checkout: Path, files) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "owa_metrics", "evaluate", "--pred", str(files[0]), "--target",
                             str(files[1])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(checkout))
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024, time.perf_counter() - start


if __name__ == "__main__":
    main()
