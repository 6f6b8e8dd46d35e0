"""``owa-metrics evaluate --html``: one self-contained page, opened in a real browser when one is installed."""

import base64
import html
import io
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from owa_metrics import VocabMap, build_tokenizer
from owa_metrics.cli import main
from owa_metrics.evaluate import write_sequences
from owa_metrics.events import simulate_session
from owa_metrics.figures.timeline import PRED_COLOR, TRUE_COLOR

UNIT = 10_000_000
LINES = 6


@pytest.fixture(scope="module")
def token_page(tmp_path_factory):
    """Six tagged sequences, line k's guess 30 ms late without every (8 - k)-th action: ``(page, dropped actions per
    line, report json path)`` of ``evaluate --pairing time --html --html-sequences 2``."""
    tmp = tmp_path_factory.mktemp("html")
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    truths, guesses, dropped = [], [], []
    for k in range(LINES):
        events = [replace(e, timestamp_ns=e.timestamp_ns // UNIT * UNIT) for e in simulate_session(5, seed=k)]
        actions = [e for e in events if e.kind != "screen"]
        kept = [e for i, e in enumerate(actions) if i % (8 - k)]
        truths.append(vocab.encode(events))
        guesses.append(vocab.encode([replace(e, timestamp_ns=e.timestamp_ns + 3 * UNIT) for e in kept]))
        dropped.append(len(actions) - len(kept))
    tags = ["game" if k % 2 else "editor" for k in range(LINES)]
    write_sequences(tmp / "true.jsonl", truths, tokenizer, tags)
    write_sequences(tmp / "pred.jsonl", guesses, tokenizer, tags)
    out = tmp / "report.html"
    assert main(["evaluate", "--pred", str(tmp / "pred.jsonl"), "--target", str(tmp / "true.jsonl"), "--pairing",
                 "time", "--json", str(tmp / "r.json"), "--html", str(out), "--html-sequences", "2"]) == 0
    return out, dropped, tmp / "r.json"


def test_the_page_holds_the_tables_and_the_timelines_of_the_worst_and_first_sequences(token_page):
    import json

    path, dropped, json_path = token_page
    text = path.read_text()
    report = json.loads(json_path.read_text())
    # self-contained: every image inline, no address outside the file, the policy lets nothing else load
    assert not re.search(r"(src|href)=\"(?!data:|#)", text) and "http" not in text.replace("http-equiv", "")
    assert "default-src 'none'" in text
    # the headline with directions, the per-category and per-tag tables
    assert "<td>comparable events</td><td>" + format(report["comparable_rate"], ".4f") + "</td>" in text
    assert "<td>↑ higher</td><td>detect/f1</td>" in text
    assert "<td>↓ lower</td><td>timestamp/abs_error_p95_ms</td>" in text
    assert "<td>keyboard</td>" in text and "<td>editor</td>" in text and "<td>game</td>" in text
    assert 'alt="target x predicted category"' in text
    # each drawn sequence's errors are its dropped actions (30 ms late: within the tolerance, matched); the worst
    # two lines first (the most dropped), then the first two
    worst = sorted(range(LINES), key=lambda k: -dropped[k])[:2]
    captions = re.findall(r'<div class="figure" id="sequence-(\d+)"><div><b>line (\d+): (\d+) errors</b>', text)
    assert [int(a) for a, _, _ in captions] == [k + 1 for k in worst] + [1, 2]
    assert all(int(errors) == dropped[int(line) - 1] for _, line, errors in captions)
    assert text.count('<button onclick="zoom(this, 1.6)">zoom in</button>') == 4
    pngs = [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]
    assert len(pngs) == 5 and all(png.startswith(b"\x89PNG") for png in pngs)  # the confusion and four timelines


def test_the_page_opens_in_a_browser_without_errors_or_requests(token_page, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no Chromium here (apt-get install -y chromium)")
    from PIL import Image

    path = token_page[0]
    shot = tmp_path / "page.png"
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
             "--v=0"]
    done = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,2400", path.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]  # errors, blocked requests, logs
    assert console == []
    dom = subprocess.run([*flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-ready="yes"' in dom  # the page's script ran to its end
    assert dom.count("<table>") >= 4 and dom.count('class="scroll"') == 4
    pixels = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    colors = {c for _, c in pixels.getcolors(1 << 20)}
    # the screenshot shows timelines: their true and predicted bars' colours
    assert {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in (TRUE_COLOR, PRED_COLOR)} <= colors


def test_d2e_folders_page_links_each_drawn_file_to_its_timeline(d2e_pairs, tmp_path):
    preds, truths = tmp_path / "preds", tmp_path / "truths"
    preds.mkdir(), truths.mkdir()
    for k, (truth, guess) in enumerate(d2e_pairs[:2]):
        (truths / f"rec{k}.mcap").write_bytes(Path(truth).read_bytes())
        (preds / f"rec{k}.mcap").write_bytes(Path(guess).read_bytes())
    out = tmp_path / "d2e.html"
    assert main(["evaluate", "--pred", str(preds), "--target", str(truths), "--bin-ms", "50", "--bin-shifts", "-2",
                 "2", "--html", str(out), "--html-sequences", "1"]) == 0
    text = out.read_text()
    rows = re.findall(r"<tr><td>(.*?)</td>", text[text.index("<h2>Per file</h2>"):])[:2]
    links = [re.match(r'<a href="#file-(\w+)">(\w+)</a>', row) for row in rows]
    drawn = re.findall(r'<div class="figure" id="file-(\w+)">', text)
    assert sorted(drawn) == sorted({m.group(1) for m in links if m}) and drawn and set(drawn) <= {"rec0", "rec1"}
    assert all(m is None or m.group(1) == m.group(2) for m in links)
    assert 'alt="latency curve: the scores with the prediction moved by k bins"' in text
    assert html.escape("d2e/keyboard/key_accuracy") in text
