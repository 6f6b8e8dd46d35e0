import dataclasses
import json

import pytest

from owa_metrics import EventCodec, __version__
from owa_metrics.cli import main
from owa_metrics.demo import DemoConfig
from owa_metrics.events import read_recording
from conftest import recording_paths
from test_readme import readme_tags


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and __version__ in capsys.readouterr().out


def test_evaluate_a_recording_against_itself_and_a_perturbed_copy(tmp_path, capsys):
    path = recording_paths()[2]
    assert main(["evaluate", "--pred", str(path), "--target", str(path), "--json", str(tmp_path / "self.json")]) == 0
    same = json.loads((tmp_path / "self.json").read_text())
    assert same["comparable_rate"] == 1.0 and same["count_accuracy"] == 1.0
    assert same["timestamp/abs_error_p95_ms"] == 0 and same["mouse/euclidean_pe_p95_pct"] == 0
    assert same["keyboard/accuracy"] == 1.0 and same["mouse/action_accuracy"] == 1.0

    codec = EventCodec()
    shifted = [dataclasses.replace(e, timestamp_ns=e.timestamp_ns + 50_000_000) for e in read_recording(path)]
    (tmp_path / "pred.jsonl").write_text(json.dumps({"text": "".join(map(codec.encode, shifted))}) + "\n")
    assert main(["evaluate", "--pred", str(tmp_path / "pred.jsonl"), "--target", str(path),
                 "--json", str(tmp_path / "shift.json")]) == 0
    late = json.loads((tmp_path / "shift.json").read_text())
    assert late["comparable_rate"] == 1.0
    assert late["timestamp/signed_error_iqm_ms"] == 50 and late["timestamp/abs_error_p95_ms"] == 50
    assert late["timestamp/signed_error_ci_low_ms"] == 50 == late["timestamp/signed_error_ci_high_ms"]
    assert "timestamp abs error P95 | 50.0 | ms" in capsys.readouterr().out


def test_evaluate_guesses_the_factorized_format_from_the_target_file(tmp_path, capsys):
    from factorized_oracle import encode_factorized

    events = read_recording(recording_paths()[2], format="factorized")
    truth = "".join(encode_factorized(e) for e in events)
    moved = [dataclasses.replace(e, dx=e.dx + (1 if e.dx >= 0 else -1)) if e.kind == "mouse" else e for e in events]
    (tmp_path / "true.txt").write_text(truth + "\n")
    (tmp_path / "pred.txt").write_text("".join(encode_factorized(e) for e in moved) + "\n")
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"),
                 "--json", str(tmp_path / "out.json")]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["comparable_rate"] == 1.0 and report["status/invalid_target_rate"] == 0
    assert report["mouse/dx_precision_p1"] == 1.0 and "mouse/dx_precision_p5" in report  # 5 levels, sign first
    assert report["mouse/dy_precision_p5"] == 1.0 and report["mouse/dx_precision_p5"] < 1.0
    capsys.readouterr()


def test_evaluate_rejects_unreadable_input_in_one_line(tmp_path, capsys):
    recording = recording_paths()[2].read_bytes()
    ok = tmp_path / "ok.txt"
    ok.write_text("<EVENT_START><SCREEN><0><0><1><fake_image_placeholder><EVENT_END>\n")
    bad = {"bad.jsonl": b"{not json\n", "binary.txt": b"\xe0\x80 tokens", "tiny.mcap": recording[:8],
           "cut.mcap": recording[:9000], "text.mcap": b"<EVENT_START>\n", "blank.txt": b"\n\n"}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    expected = {"bad.jsonl": "bad.jsonl:1: not JSON", "binary.txt": "binary.txt: not UTF-8 text (byte 0xe0 at offset 0)",
                "tiny.mcap": "tiny.mcap: MCAP file truncated at byte 8", "cut.mcap": "cut.mcap: MCAP file truncated at "
                "byte 9000", "text.mcap": "text.mcap: not an MCAP file", "blank.txt": "blank.txt: no sequences",
                "missing.txt": "missing.txt: cannot read it (No such file or directory)"}
    for name, message in expected.items():
        assert main(["evaluate", "--pred", str(tmp_path / name), "--target", str(ok)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (name, err)


def test_evaluate_warns_when_no_predicted_event_decodes_and_writes_json_into_new_folders(tmp_path, capsys):
    truth = tmp_path / "true.txt"
    truth.write_text("<EVENT_START><SCREEN><0><0><1><fake_image_placeholder><EVENT_END>\n")
    (tmp_path / "pred.txt").write_text("hello world\n")
    out = tmp_path / "new" / "folder" / "report.json"
    args = ["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(truth), "--json", str(out),
            "--generated-screens", "scored"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "pred.txt: no predicted event decodes (0 event spans found)" in err
    assert json.loads(out.read_text())["status/missing"] == 1 and not list(out.parent.glob("*.tmp"))
    assert main(args + ["--strict"]) == 1


def test_demo_config_yaml_is_the_default():
    from pathlib import Path

    config = DemoConfig.from_yaml(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert config == DemoConfig()


def test_demo_learns_and_logs_every_epoch(demo_run):
    """The demo with its defaults (3 epochs, hierarchical); the callback tests cover the factorized format."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lightning_fixtures import report_of

    printed, log_dir = demo_run
    assert "tensorboard --logdir" in printed and "comparable events" in printed
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    logged = report_of({tag: events.Scalars(tag) for tag in events.Tags()["scalars"]})
    for key in ("comparable_rate", "category/macro_f1", "timestamp/precision_p1", "mouse_nop/comparable_rate",
                "token_accuracy/timestamp", "screen/loss", "mouse/dx_precision_p4", "status/invalid_target_rate"):
        assert len(logged[key]) == 3, key
    comparable = [p.value for p in events.Scalars("val/owa/comparable_rate")]
    assert comparable[-1] > comparable[0]
    tags = {tag for tags in events.Tags().values() if isinstance(tags, list) for tag in tags}
    assert len(readme_tags()) >= 8 and readme_tags() <= tags, readme_tags() - tags  # as the README names them


def test_evaluate_pairs_by_time(tmp_path, capsys):
    from matching_oracle import time_oracle
    from oracles import close
    from owa_metrics import build_tokenizer
    from sequence_oracle import sequence_oracle
    from owa_metrics.offline.evaluate import tokenize

    events = read_recording(recording_paths()[0])
    codec = EventCodec()
    truth = "".join(map(codec.encode, events[:80]))
    guess = "".join(map(codec.encode, events[1:40] + [dataclasses.replace(e, timestamp_ns=e.timestamp_ns + 70_000_000)
                                                      for e in events[40:80]]))
    (tmp_path / "true.txt").write_text(truth + "\n")
    (tmp_path / "pred.txt").write_text(guess + "\n")
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"),
                 "--pairing", "time", "--tolerance-ms", "100", "--json", str(tmp_path / "out.json"),
                 "--generated-screens", "scored"]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert "detection F1 (time pairing)" in capsys.readouterr().out
    tokenizer = build_tokenizer()
    ids = [[tokenize(text, tokenizer.get_vocab(), tokenizer.unk_token_id)] for text in (guess, truth)]
    from owa_metrics import VocabMap

    oracle = time_oracle(*ids, VocabMap.from_tokenizer(tokenizer), tolerance_ms=100)
    assert oracle["count/missing_events"] >= 1 and oracle["detect/time_error_abs_p50_ms"] == 70
    oracle.update(sequence_oracle(*ids, VocabMap.from_tokenizer(tokenizer))["time"])  # issue 26's keys
    assert oracle["count/path_rows"] == 1 and "mouse/move_coverage" in oracle
    assert all(close(report[k], v, 1e-9) for k, v in oracle.items()), oracle  # a CI end: in its Band
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"),
                 "--pairing", "time", "--tolerance-ms", "9000"]) == 2
    assert "tolerance_ms must be in [0, 8000)" in capsys.readouterr().err


def test_evaluate_reads_tags_from_jsonl_and_reports_each_alone(tmp_path, capsys):
    """A "tag" per target line: each tag's keys equal the same command on that tag's lines alone; the per-tag
    table in the printed report (tags sorted); a line without a tag, or files that disagree, are refused."""
    import numpy as np

    from owa_metrics.events import simulate_session
    from metric_oracle import perturb

    codec, rng = EventCodec(), np.random.default_rng(1)
    events = simulate_session(30, seed=2)
    chunks = [events[i:i + 20] for i in range(0, len(events), 20)][:20]
    tags = [("vscode", "minecraft", "chrome")[i % 3] for i in range(len(chunks))]
    lines = [("".join(map(codec.encode, perturb(c, rng))), "".join(map(codec.encode, c)), t)
             for c, t in zip(chunks, tags)]

    def run(name, rows, tagged=True):
        pred, true, out = (tmp_path / f"{name}.{x}" for x in ("pred.jsonl", "true.jsonl", "json"))
        pred.write_text("".join(json.dumps({"text": p}) + "\n" for p, _, _ in rows))
        true.write_text("".join(json.dumps({"text": t, **({"tag": g} if tagged else {})}) + "\n" for _, t, g in rows))
        assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--json", str(out),
                     "--generated-screens", "scored"]) == 0
        return json.loads(out.read_text())

    report = run("all", lines)
    printed = capsys.readouterr().out
    table = printed[printed.index("## Per tag"):].splitlines()
    assert [line.split("|")[1].strip() for line in table[4:7]] == ["chrome", "minecraft", "vscode"]
    for name in ("chrome", "minecraft", "vscode"):
        alone = run(name, [row for row in lines if row[2] == name], tagged=False)
        mine = {k[len(f"tag/{name}/"):]: v for k, v in report.items() if k.startswith(f"tag/{name}/")}
        assert mine["count/sequences"] == tags.count(name) == alone["count/sequences"]
        assert mine["count/target_events"] == sum(len(c) for c, t in zip(chunks, tags) if t == name)
        assert "comparable_rate" in mine and all(abs(v - alone[k]) <= 1e-12 * max(1, abs(v)) for k, v in mine.items())
    capsys.readouterr()

    (tmp_path / "half.jsonl").write_text(json.dumps({"text": lines[0][1], "tag": "a"}) + "\n"
                                         + json.dumps({"text": lines[1][1]}) + "\n")
    (tmp_path / "other.jsonl").write_text("".join(json.dumps({"text": t, "tag": "b"}) + "\n" for _, t, _ in lines[:2]))
    assert main(["evaluate", "--pred", str(tmp_path / "half.jsonl"), "--target", str(tmp_path / "other.jsonl")]) == 2
    assert "half.jsonl:2: no 'tag', while other lines have one" in capsys.readouterr().err
    (tmp_path / "two.jsonl").write_text("".join(json.dumps({"text": t, "tag": "a"}) + "\n" for _, t, _ in lines[:2]))
    assert main(["evaluate", "--pred", str(tmp_path / "two.jsonl"), "--target", str(tmp_path / "other.jsonl")]) == 2
    assert "two.jsonl:1 is tagged 'a' but" in capsys.readouterr().err
