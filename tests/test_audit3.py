"""Issue 43's findings outside DDP (items 1, 2, 5, 6, 7, 8): each test reproduces one defect; the expected values are
written out by hand (events, counts, the files' bytes), not read from the code. The DDP items are in
test_distributed.py."""

import json
import os

import pytest

from owa_metrics import VocabMap, build_tokenizer
from owa_metrics.cli import main
from owa_metrics.demo import summary
from owa_metrics.evaluate import evaluate, write_sequences
from owa_metrics.schema import Event
from owa_metrics.offline import streaming

from test_audit_cli import key, one_line

MS = 1_000_000


# 1. an output flag naming an input file
def test_an_output_path_that_is_an_input_is_refused_before_anything_is_read(tmp_path, capsys):
    pred, true = tmp_path / "pred.txt", tmp_path / "true.txt"
    pred.write_text(key(1_000) + "\n")
    true.write_text(key(1_000) + "\n")
    (tmp_path / "link.json").symlink_to(true)
    os.link(pred, tmp_path / "hard.json")
    recording = tmp_path / "rec.mcap"
    recording.write_bytes(b"not read: the refusal comes first")
    (tmp_path / "preds").mkdir(), (tmp_path / "truths").mkdir()
    for folder in ("preds", "truths"):
        (tmp_path / folder / "a.mcap").write_bytes(recording.read_bytes())
    cases = [(["--pred", pred, "--target", true, "--json", pred], "pred.txt: --json names an input file"),
             (["--pred", pred, "--target", true, "--json", true], "true.txt: --json names an input file"),
             (["--pred", pred, "--target", true, "--json", tmp_path / "link.json"], f"(the input {true})"),
             (["--pred", pred, "--target", true, "--json", tmp_path / "hard.json"], f"(the input {pred})"),
             (["--pred", pred, "--target", tmp_path / ".." / tmp_path.name / "true.txt", "--json", true],
              "true.txt: --json names an input file"),
             (["--pred", recording, "--target", recording, "--bin-ms", 50, "--json", recording], "rec.mcap: --json"),
             (["--pred", tmp_path / "preds", "--target", tmp_path / "truths", "--bin-ms", 50, "--json",
               tmp_path / "truths" / "a.mcap"], "truths/a.mcap: --json names an input file"),
             (["--pred", pred, "--target", true, "--html", true], "true.txt: --html names an input file")]
    before = {path: path.read_bytes() for path in (pred, true, recording, tmp_path / "truths" / "a.mcap")}
    for args, said in cases:
        assert main(["evaluate", *map(str, args)]) == 2
        captured = capsys.readouterr()  # refused before anything is read: no report, one line
        assert captured.out == "" and captured.err.count("\n") == 1 and said in captured.err, (said, captured.err)
        assert "choose another path" in captured.err
    assert {path: path.read_bytes() for path in before} == before and (tmp_path / "link.json").is_symlink()
    # a JSON report beside the recordings in an input folder is not an input: written
    assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--json", str(tmp_path / "truths" / "r.json"),
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "truths" / "r.json").read_text())["count/target_events"] == 1
    assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--json", "/dev/null", "--no-progress"]) == 0


# 2. a JSONL line nested 100,000 levels deep
@pytest.mark.parametrize("line", ['{"text": %s}', '{"text": "<EVENT_START>", "tag": %s}', '%s'])
def test_json_nested_too_deep_is_one_line_naming_the_file_and_line(tmp_path, capsys, line):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "true.jsonl").write_text(json.dumps({"text": key(1_000)}) + "\n" + line % deep + "\n")
    (tmp_path / "pred.jsonl").write_text(json.dumps({"text": key(1_000)}) + "\n" + json.dumps({"text": ""}) + "\n")
    assert main(["evaluate", "--pred", str(tmp_path / "pred.jsonl"), "--target", str(tmp_path / "true.jsonl"),
                 "--no-progress"]) == 2
    one_line(capsys, f"{tmp_path / 'true.jsonl'}:2: JSON nested too deep")


# 7. a prediction file that shrinks between the line index and the read (a writer still at it)
def test_a_file_that_shrinks_while_read_is_one_line(tmp_path, capsys, monkeypatch):
    pred, true = tmp_path / "pred.txt", tmp_path / "true.txt"
    pred.write_text("".join(key(1_000 + 10 * k) + "\n" for k in range(10)))
    true.write_text(pred.read_text())
    indexed = streaming.line_indexes

    def then_shrink(paths):  # the index counts 10 lines, then the writer truncates the file to 4
        out = indexed(paths)
        pred.write_text("".join(key(1_000 + 10 * k) + "\n" for k in range(4)))
        return out

    monkeypatch.setattr(streaming, "line_indexes", then_shrink)
    assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--no-progress"]) == 2
    one_line(capsys, f"owa-metrics evaluate: {pred}: fewer lines than counted", "changed while being read")


# 5. demo --epochs below 1; one epoch's summary
def test_demo_epochs_below_one_is_refused_and_one_epoch_prints_one_column(tmp_path, capsys):
    for epochs in ("0", "-1"):
        assert main(["demo", "--epochs", epochs, "--out", str(tmp_path / "runs")]) == 2
        one_line(capsys, "owa-metrics demo: --epochs must be a whole number >= 1", f"got {epochs}")
    (tmp_path / "c.yaml").write_text("epochs: 2\n")
    assert main(["demo", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "c.yaml")]) == 2
    one_line(capsys, "owa-metrics demo: --out must be a folder's path (not a file's)")
    assert not (tmp_path / "runs").exists() and (tmp_path / "c.yaml").read_text() == "epochs: 2\n"
    report = {"epoch": 0, "step": 5, "comparable_rate": 0.25, "timestamp/abs_error_p95_ms": 120.0}
    lines = summary({"log_dir": "runs/csv/version_0", "first": report, "last": report}, "csv").splitlines()
    assert lines[2].split() == ["metric", "unit", "epoch", "0", "key"]  # one column, no "better"
    row = next(line for line in lines if line.endswith(" comparable_rate"))
    assert row.split()[-2:] == ["0.2500", "comparable_rate"] and " no " not in row and " yes " not in row
    later = {**report, "epoch": 2, "step": 15, "comparable_rate": 0.5}
    lines = summary({"log_dir": "runs/csv/version_0", "first": report, "last": later}, "csv").splitlines()
    assert lines[2].split() == ["metric", "unit", "epoch", "0", "epoch", "2", "better", "key"]
    row = next(line for line in lines if line.endswith(" comparable_rate"))
    assert row.split()[-4:] == ["0.2500", "0.5000", "yes", "comparable_rate"]


# 6. --config values
def test_demo_config_values_are_checked_naming_the_file_and_key(tmp_path, capsys):
    cases = {"batch_size: 0": "batch_size must be a whole number >= 1, got 0",
             "lr: fast": "lr must be a number > 0, got 'fast'",
             "threads: 0": "threads must be a whole number >= 1, got 0",
             "n_head: 3": "n_head must split n_embd into heads of an even width",
             "epochs: abc": "epochs must be a whole number >= 1, got 'abc'",
             "epochs: true": "epochs must be a whole number >= 1, got True",
             "val_fraction: 1.5": "val_fraction must be a number in (0, 1), got 1.5",
             "format: hieararchical": "format must be hierarchical or factorized",
             "mix: {typing: 0.5}": "mix must be a mapping of activity weights",
             "seq_len: 4": "seq_len: a screen event takes ",  # a screen event (with its image tokens) is longer
             "duration_s: 0.2": "duration_s: not enough events for a train and a validation split"}
    for k, (setting, said) in enumerate(cases.items()):
        config = tmp_path / f"c{k}.yaml"
        config.write_text(f"{setting}\nduration_s: 20\n" if not setting.startswith("duration_s") else setting + "\n")
        assert main(["demo", "--config", str(config), "--out", str(tmp_path / "runs")]) == 2, setting
        one_line(capsys, f"owa-metrics demo: {config}: {said}")
    assert not (tmp_path / "runs").exists()


# 8. write_sequences with an id the tokenizer has no token for
def test_an_id_past_the_tokenizer_is_written_as_unknown_and_counted_as_not_decoding(tmp_path):
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    events = [Event(kind="keyboard", timestamp_ns=t * MS, vk=65, action=a) for t, a in ((1_000, "press"),
                                                                                         (1_200, "release"))]
    truth = vocab.encode(events)
    past = len(tokenizer) + 5  # e.g. an embedding padded to a multiple of 64
    pred = list(truth)
    pred[3] = past  # a timestamp digit of the first event
    pred.insert(len(truth) // 2, past)  # and one between the events
    write_sequences(tmp_path / "pred.jsonl", [pred], tokenizer)
    write_sequences(tmp_path / "true.jsonl", [truth], tokenizer)
    text = json.loads((tmp_path / "pred.jsonl").read_text())["text"]
    tokens = tokenizer.convert_ids_to_tokens(truth)
    assert text == "".join(tokens[:3] + ["<unk>"] + tokens[4:len(truth) // 2] + ["<unk>"] + tokens[len(truth) // 2:])
    report = evaluate(tmp_path / "pred.jsonl", tmp_path / "true.jsonl", progress=False)
    # the first predicted event does not decode (a token where a digit belongs), the second is right
    assert report["count/target_events"] == 2 and report["status/valid"] == 1 and report["status/invalid_format"] == 1
