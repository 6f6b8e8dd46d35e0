"""The README's Python blocks run as written, each in a fresh namespace and a temporary folder, and do what the
README says they do."""

import ast
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
NAMES = ["the flow", "metrics", "lightning", "hf trainer"]


def _block(name: str) -> str:
    keys = {"the flow": "decode_batch(preds", "metrics": "metric.compute()", "lightning": "trainer.fit(",
            "hf trainer": "trainer.evaluate()"}
    found = [b for b in BLOCKS if keys[name] in b]
    assert len(found) == 1, f"README: expected one Python block with {keys[name]!r}"
    return found[0]


def test_every_python_block_is_one_of_the_tested_ones():
    assert sorted(map(BLOCKS.index, map(_block, NAMES))) == list(range(len(BLOCKS)))


def _run(name, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_block(name), f"README.md ({name} block)", "exec"), namespace)
    return namespace


def test_the_flow_block_encodes_as_its_comment_says(tmp_path, monkeypatch):
    code = _block("the flow")
    shown = ast.literal_eval(re.search(r"^# ('<EVENT_START>.*')$", code, re.M).group(1))
    namespace = _run("the flow", tmp_path, monkeypatch)
    assert namespace["text"] == shown
    batch = namespace["batch"]
    assert len(batch) == len(namespace["events"]) and batch.target.timestamp_ns.shape == (len(batch),)


def test_the_metrics_block_returns_0d_float64_tensors(tmp_path, monkeypatch, capsys):
    report = _run("metrics", tmp_path, monkeypatch)["report"]
    assert report and all(isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype == torch.float64
                          for v in report.values())
    rate, events = capsys.readouterr().out.split()
    assert 0 <= float(rate) <= 1 and int(events) > 0


def test_the_lightning_block_logs_to_tensorboard(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _run("lightning", tmp_path, monkeypatch)["trainer"]
    assert "val/owa/comparable_rate" in trainer.callback_metrics
    events = EventAccumulator(trainer.logger.log_dir, size_guidance={"tensors": 0, "histograms": 0, "images": 0})
    events.Reload()
    logged = {tag for tags in events.Tags().values() if isinstance(tags, list) for tag in tags}
    assert {"val/owa/comparable_rate", "val/owa/category_confusion", "val/owa/samples"} <= logged  # the demo test
    # checks every tag the README names (an untrained model has no comparable mouse events to histogram)


def readme_tags() -> set[str]:
    """The TensorBoard tags the README's "TensorBoard then shows" paragraph names."""
    paragraph = README.read_text().split("TensorBoard then shows", 1)[1].split("\n\n", 1)[0]
    return {tag.replace("{x,y}", axis) for tag in re.findall(r"`(val/owa/[^`]+)`", paragraph) for axis in "xy"}


def test_the_hf_trainer_block_evaluates(tmp_path, monkeypatch, capsys):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs the 'hf' extra (accelerate)")
    _run("hf trainer", tmp_path, monkeypatch)
    printed = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= printed["eval_owa/comparable_rate"] <= 1 and printed["eval_owa/count/target_events"] > 0
