"""Issue 22's CLI and install findings: each test reproduces one defect and checks the fix against hand-computed
values (event times and counts written out below), not against the code's own output."""

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from owa_metrics import CodecConfig, EventCodec
from owa_metrics.cli import main
from owa_metrics.schema import Event

ROOT = Path(__file__).resolve().parents[1]
MS = 1_000_000


def key(t_ms, vk=65, action="press", fmt="hierarchical"):
    return EventCodec(CodecConfig.preset(fmt)).encode(Event(kind="keyboard", timestamp_ns=t_ms * MS, vk=vk,
                                                            action=action))


def screen(t_ms, fmt="hierarchical"):
    return EventCodec(CodecConfig.preset(fmt)).encode(Event(kind="screen", timestamp_ns=t_ms * MS))


def run_python(code, env=None, prefix=()):
    """``code`` in a fresh interpreter importing this checkout; returns (exit code, stdout, stderr)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    out = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True,
                         text=True, timeout=120)
    return out.returncode, out.stdout, out.stderr


def write_mcap(path, vk):
    """An OWA recording holding one key press with virtual-key code ``vk`` (stored as given, no range check)."""
    mcap = pytest.importorskip("mcap_owa.highlevel", reason="writing recordings needs mcap-owa-support")
    from owa.msgs.desktop.keyboard import KeyboardEvent

    with mcap.OWAMcapWriter(str(path)) as writer:
        writer.write_message(KeyboardEvent(event_type="press", vk=vk), topic="keyboard", timestamp=1_000 * MS)
    return path


def one_line(capsys, *fragments):
    """The one line on stderr (besides evaluate's progress bar), holding every fragment."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("evaluate: ")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert all(f in err[0] for f in fragments), (fragments, err)
    return err[0]


# 6. a read-only install: no writable place for numba's cache
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run Python without the right to write anywhere it owns")
def test_import_from_a_read_only_install_without_a_cache_dir(tmp_path):
    # The interpreter lives under /root (mode 700), so an unprivileged uid cannot run it; instead uid 0 runs without
    # any capability (setpriv --bounding-set=-all): permission bits then bind it like any user, and every file of the
    # copied package and HOME is read-only.
    shutil.copytree(ROOT / "owa_metrics", tmp_path / "site" / "owa_metrics",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "home").mkdir()
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
        env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(tmp_path / "site"), MPLCONFIGDIR="/nonexistent")
        out = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c",
                              "from owa_metrics.decode import kernel; print(kernel.available(), kernel.__file__)"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        for path in [tmp_path, *tmp_path.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", str(tmp_path / "site" / "owa_metrics" / "decode" / "kernel.py")]
    assert out.stderr.count("numba cannot cache the CPU kernels") == 1 and "NUMBA_CACHE_DIR" in out.stderr


# 8. NUMBA_DISABLE_JIT=1: the kernels would run as Python loops
def test_numba_disable_jit_takes_the_torch_path_with_one_warning():
    code, out, err = run_python(f"""
        import json, torch
        from owa_metrics import OWAEventMetrics, build_tokenizer
        from owa_metrics.decode import kernel
        tokenizer = build_tokenizer()
        ids = lambda text: tokenizer(text)["input_ids"]
        metric = OWAEventMetrics(tokenizer, alignment="generation")
        for _ in range(2):
            metric.update(torch.tensor([ids({key(1050) + key(2000, vk=66)!r})]),
                          torch.tensor([ids({key(1000) + key(2000, vk=67)!r})]))
        report = metric.compute()
        print(json.dumps([kernel.available(), float(report["timestamp/abs_error_p95_ms"]),
                          float(report["keyboard/accuracy"]), float(report["count/target_events"])]))
        """, env={"NUMBA_DISABLE_JIT": "1"})
    assert code == 0, err[-2000:]
    # two updates of two pairs: abs errors 50, 0, 50, 0 ms (P95 of the exact samples: 50); vk right in half of them
    assert json.loads(out.splitlines()[-1]) == [False, 50.0, 0.5, 4.0]
    assert err.count("NUMBA_DISABLE_JIT is set") == 1


# 9. --json onto a FIFO or a device
def test_json_onto_a_fifo_or_dev_null_writes_through(tmp_path, capsys):
    (tmp_path / "true.txt").write_text(key(1000) + "\n")
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    args = ["evaluate", "--pred", str(tmp_path / "true.txt"), "--target", str(tmp_path / "true.txt"), "--json"]
    assert main(args + [str(fifo)]) == 0
    assert stat.S_ISFIFO(fifo.stat().st_mode), "the FIFO was replaced by a regular file"
    reader.join(timeout=10)
    assert received and json.loads(received[0])["keyboard/accuracy"] == 1.0
    assert main(args + ["/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    (tmp_path / "old.json").write_text("previous report")
    (tmp_path / "link.json").symlink_to("old.json")  # a link to a regular file: the file replaced, the link kept
    assert main(args + [str(tmp_path / "link.json")]) == 0
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "old.json").read_text())["keyboard/accuracy"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "old.json", "report.fifo", "true.txt"]
    capsys.readouterr()


# 10. a failed --json write leaves no temporary file
def test_a_failed_json_write_leaves_nothing_behind(tmp_path, capsys):
    (tmp_path / "true.txt").write_text(key(1000) + "\n")
    (tmp_path / "out").mkdir()
    args = ["evaluate", "--pred", str(tmp_path / "true.txt"), "--target", str(tmp_path / "true.txt"), "--json"]
    assert main(args + [str(tmp_path / "out")]) == 2
    one_line(capsys, "out: cannot write the JSON report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "true.txt"]
    assert not any((tmp_path / "out").iterdir())

    old = tmp_path / "out" / "report.json"
    old.write_text("previous report")
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, limits[1]))  # the report (~6 kB) fails part way
    try:
        code = main(args + [str(old)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert code == 2
    one_line(capsys, "report.json: cannot write the JSON report")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["report.json"] and old.read_text() == "previous report"


# 11. lines end at \n or \r\n only
def test_lines_split_at_newlines_only(tmp_path, capsys):
    a, b = key(1000), key(2000, vk=66)
    # U+2028 (a line separator to str.splitlines) raw inside a JSON string: one valid line, one sequence
    (tmp_path / "true.jsonl").write_text(json.dumps({"text": a + "\u2028" + b}, ensure_ascii=False) + "\r\n",
                                         encoding="utf-8")
    (tmp_path / "pred.txt").write_text(a + "\f" + b + "\n")  # a form feed inside the line: still one sequence
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.jsonl"),
                 "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["count/target_events"] == 2 and report["count/pred_events"] == 2
    assert report["keyboard/accuracy"] == 1.0
    capsys.readouterr()


# 12. a blank prediction line is an empty sequence
def test_a_blank_prediction_line_is_an_empty_sequence(tmp_path, capsys):
    (tmp_path / "true.txt").write_text(f"{key(1000)}\n{key(1000, vk=66)}\n{key(1000, vk=67)}\n")
    (tmp_path / "pred.txt").write_text(f"{key(1000)}\n\n{key(1000, vk=67)}\n")
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"),
                 "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    # line 2's true event has no prediction; lines 1 and 3 pair with their own lines (same vk)
    assert report["count/target_events"] == 3 and report["status/missing"] == 1 and report["status/valid"] == 2
    assert report["keyboard/accuracy"] == 1.0
    capsys.readouterr()


# 13. an MCAP holding a field out of every format's range
def test_out_of_range_recorded_fields_name_the_file(tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text(key(1000) + "\n")
    for vk in (300, -5):
        path = write_mcap(tmp_path / f"vk{vk}.mcap", vk)
        assert main(["evaluate", "--pred", str(path), "--target", str(good)]) == 2
        one_line(capsys, f"vk{vk}.mcap", f"got {vk}")
        assert main(["evaluate", "--pred", str(good), "--target", str(path)]) == 2
        one_line(capsys, f"vk{vk}.mcap", f"got {vk}")
        assert main(["inspect", str(path)]) == 2
        one_line(capsys, f"vk{vk}.mcap", f"got {vk}")


# 14. demo and inspect arguments
def test_demo_and_inspect_argument_errors_in_one_line(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("epochs: [1\n")
    (tmp_path / "binary.yaml").write_bytes(b"epochs: \xff\xfe\n")
    (tmp_path / "list.yaml").write_text("- 1\n")
    (tmp_path / "fake.mcap").write_text("not a recording\n")
    cases = {("--config", "missing.yaml"): "missing.yaml: cannot read it (No such file or directory)",
             ("--config", "."): "cannot read it (Is a directory)",
             ("--config", "bad.yaml"): "bad.yaml: not valid YAML (line 2)",
             ("--config", "binary.yaml"): "binary.yaml: not UTF-8 text",
             ("--config", "list.yaml"): "list.yaml: expected a mapping of settings",
             ("--mcap", "fake.mcap"): "fake.mcap: not an MCAP file"}
    for (option, name), message in cases.items():
        assert main(["demo", option, str(tmp_path / name), "--out", str(tmp_path / "runs")]) == 2, name
        one_line(capsys, "owa-metrics demo: ", message)
    assert not (tmp_path / "runs").exists()
    path = write_mcap(tmp_path / "one_key.mcap", 65)  # a key press takes 8 tokens
    assert main(["inspect", "--max-tokens", "3", str(path)]) == 2
    one_line(capsys, "one_key.mcap", "takes 8 tokens, more than max_tokens=3", "--max-tokens")


# also noticed: a factorized file of screens only
def test_a_screens_only_target_says_the_format_is_a_guess(tmp_path, capsys):
    # factorized screens at 9.99 s and 10.01 s (<9><9><9>, <0><0><1>): read as hierarchical, 9.99 s and 0.01 s
    (tmp_path / "true.txt").write_text(screen(9_990, "factorized") + "\n")
    (tmp_path / "pred.txt").write_text(screen(10_010, "factorized") + "\n")
    assert screen(9_990, "factorized") == screen(9_990) and screen(10_010, "factorized") == screen(10)
    args = ["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"), "--json",
            str(tmp_path / "r.json"), "--generated-screens", "scored"]
    assert main(args) == 0
    one_line(capsys, "warning: ", "true.txt", "do not tell the token format", "--format")
    assert main(args + ["--strict"]) == 1
    capsys.readouterr()
    assert main(args + ["--format", "factorized"]) == 0
    assert "warning" not in capsys.readouterr().err
    # the 10 s window: 10.01 s reads 0.01 s, 20 ms after 9.99 s
    assert json.loads((tmp_path / "r.json").read_text())["timestamp/abs_error_p95_ms"] == 20

    # a digit above 9 (12.34 s -> <12><3><4>) can only be hierarchical: no warning
    (tmp_path / "true.txt").write_text(screen(12_340) + "\n")
    (tmp_path / "pred.txt").write_text(screen(12_360) + "\n")
    assert "<12>" in screen(12_340)
    assert main(args) == 0
    assert "warning" not in capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["timestamp/abs_error_p95_ms"] == 20
