"""The pictures in the docs (issue 45): a timeline from the demo, and a screenshot of an HTML report.

    python scripts/docs_figures.py [--out docs]

1. ``owa-metrics demo`` with its defaults (into a temporary folder); its last epoch's first timeline, the PNG the
   callback writes beside the ``.md`` report, is copied to ``docs/timeline.png`` (README.md shows it).
2. Six simulated 5 s sessions as the true sequences, each guessed 30 ms late with every (8 - k)-th action left out,
   tagged ``editor`` / ``game``; ``owa-metrics evaluate --pairing time --html`` writes the page and headless Chromium
   (``apt-get install -y chromium``) screenshots its top to ``docs/html_report.png`` (docs/OFFLINE.md shows it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

UNIT = 10_000_000  # the formats' 10 ms timestamp unit


def demo_timeline(out: Path, tmp: Path) -> Path:
    from owa_metrics.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--out", str(tmp / "demo")]) == 0
    pngs = sorted((tmp / "demo").glob("tensorboard/version_0/owa_metrics/val/owa/epoch_*_timeline_0.png"),
                  key=lambda p: int(p.name.split("_")[1]))
    target = out / "timeline.png"
    shutil.copyfile(pngs[-1], target)
    return target


def html_screenshot(out: Path, tmp: Path) -> Path:
    from owa_metrics import VocabMap, build_tokenizer
    from owa_metrics.cli import main
    from owa_metrics.offline.evaluate import write_sequences
    from owa_metrics.events import simulate_session

    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    truths, guesses = [], []
    for k in range(6):
        events = [replace(e, timestamp_ns=e.timestamp_ns // UNIT * UNIT) for e in simulate_session(5, seed=k)]
        actions = [e for e in events if e.kind != "screen"]
        truths.append(vocab.encode(events))
        guesses.append(vocab.encode([replace(e, timestamp_ns=e.timestamp_ns + 3 * UNIT)
                                     for i, e in enumerate(actions) if i % (8 - k)]))
    tags = ["game" if k % 2 else "editor" for k in range(6)]
    write_sequences(tmp / "true.jsonl", truths, tokenizer, tags)
    write_sequences(tmp / "pred.jsonl", guesses, tokenizer, tags)
    page = tmp / "report.html"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["evaluate", "--pred", str(tmp / "pred.jsonl"), "--target", str(tmp / "true.jsonl"),
                     "--pairing", "time", "--html", str(page), "--html-sequences", "2"]) == 0
    target = out / "html_report.png"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={target}", "--window-size=1280,2000", page.as_uri()], check=True,
                   capture_output=True, timeout=120)
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for made in (demo_timeline(args.out, Path(tmp)), html_screenshot(args.out, Path(tmp))):
            print(f"wrote {made}")


if __name__ == "__main__":
    main()
