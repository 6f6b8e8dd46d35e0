"""The README's Python blocks run as written, each in a fresh namespace and a temporary folder, and do what the
README says they do."""

import ast
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
NAMES = ["the flow", "metrics", "lightning", "your tokenizer", "hf trainer"]


def _block(name: str) -> str:
    keys = {"the flow": "decode_batch(preds", "metrics": "metric.compute()", "lightning": "trainer.fit(",
            "your tokenizer": "resize_token_embeddings(", "hf trainer": "trainer.evaluate()"}
    found = [b for b in BLOCKS if keys[name] in b]
    assert len(found) == 1, f"README: expected one Python block with {keys[name]!r}"
    return found[0]


def test_every_python_block_is_one_of_the_tested_ones():
    assert sorted(map(BLOCKS.index, map(_block, NAMES))) == list(range(len(BLOCKS)))


def _run(name, tmp_path, monkeypatch, **given) -> dict:
    monkeypatch.chdir(tmp_path)
    namespace: dict = dict(given)
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


def test_the_your_tokenizer_block_makes_training_data_and_a_metric(tmp_path, monkeypatch, capsys):
    """The block's NAME, a hub id, is found in a local Hugging Face cache (offline): a tiny Llama and a tokenizer
    without event or image tokens, as a text checkpoint's. The block's sequences hold every simulated screen, its
    image tokens (SmolVLM's 64 and 3 markers) labelled -100."""
    from huggingface_hub import constants
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from owa_metrics import CodecConfig
    from owa_metrics.events import simulate_session

    name = re.search(r'^NAME = "([^"]+)"', _block("your tokenizer"), re.M).group(1)
    snapshot = tmp_path / "hub" / f"models--{name.replace('/', '--')}" / "snapshots" / ("0" * 40)
    words = ["<|endoftext|>", "<unk>", "hello"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>").save_pretrained(
        snapshot)
    LlamaForCausalLM(LlamaConfig(vocab_size=3, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, bos_token_id=None, eos_token_id=0,
                                 pad_token_id=0)).save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    namespace = _run("your tokenizer", tmp_path, monkeypatch)

    config = CodecConfig.preset("factorized")
    added = {*config.event_tokens, *config.extra_tokens}
    tokenizer = namespace["tokenizer"]
    assert len(tokenizer) == 3 + len(added) and added <= set(tokenizer.get_vocab())
    assert namespace["model"].get_input_embeddings().weight.shape[0] == len(tokenizer)
    screens = sum(e.kind == "screen" for e in simulate_session(10.0, format="factorized"))
    ids, labels = (torch.cat([item[k] for item in namespace["data"]]) for k in ("input_ids", "labels"))
    assert screens > 0 and int((ids == tokenizer.convert_tokens_to_ids("<global-img>")).sum()) == screens
    assert int((labels == -100).sum()) == screens * (64 + 3)
    assert namespace["metric"].vocab.config.format == "factorized" and "factorized" in capsys.readouterr().out


def test_the_install_says_how_to_get_the_cpu_build_of_torch():
    """`pip install "torch==2.13.0"` takes PyPI's default build, CUDA on Linux: the README gives PyTorch's CPU index
    for a machine without a GPU, and no longer says that installing torch first avoids the CUDA wheels."""
    section = " ".join(README.read_text().split("## Two commands", 1)[1].split("## ", 1)[0].split())
    assert '`pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu`' in section
    assert "GPU users keep it" in section and "otherwise pull CUDA wheels" not in section


PLACEHOLDER = re.compile(r"\b(TODO|TBD|XXX|FIXME)\b|\b[A-Z][A-Z0-9]*_TIME\b|<fill|\?\?\?", re.I)


def test_the_readme_holds_no_placeholder():
    found = [m.group(0) for m in PLACEHOLDER.finditer(README.read_text())]
    assert not found, found


DEMO_ROW = re.compile(r"^(?P<words>\S.*?)\s{2,}(?P<unit>\S+)\s+(?P<first>\S+)\s+(?P<last>\S+)\s+(?P<better>yes|no|)"
                      r"\s+(?P<key>\S+)$")


def _demo_table(text: str) -> tuple[list[str], list[dict]]:
    """The demo's printed table: its header's columns and one dict a row (words, unit, first, last, better, key)."""
    lines = text[text.index("metric  "):].splitlines()
    rows = []
    for line in lines[1:]:
        if not line.strip() or line.startswith("```"):
            break
        row = DEMO_ROW.match(line)
        assert row, line
        rows.append({**row.groupdict(), **{k: float(row[k].replace(",", "")) for k in ("first", "last")}})
    return lines[0].split(), rows


def test_the_readme_demo_table_and_samples_have_the_demos_form_and_directions(demo_run):
    """The README shows the demo's output with the tested versions (constraints.txt); a dependency release moves
    the trained model's figures in their last digits, so what is checked is what survives one: the same columns,
    the same rows (words, unit, key), each row's words and unit the report's for its key, every row improving from
    the first epoch to the last in both (the key's direction), and a sample excerpt in the report's columns, every
    category in it."""
    from owa_metrics.functional.report import WORDS, higher_is_better
    from owa_metrics.report import SAMPLE_COLUMNS, unit_of
    from owa_metrics.schema import Status

    printed, log_dir = demo_run
    (shown_header, shown), (header, got) = _demo_table(README.read_text()), _demo_table(printed)
    assert shown_header == header == ["metric", "unit", "epoch", "0", "epoch", "2", "better", "key"]
    assert len(got) >= 6 and [(r["words"], r["unit"], r["key"]) for r in shown] == [
        (r["words"], r["unit"], r["key"]) for r in got]
    for row in shown + got:
        assert (row["words"], row["unit"]) == (WORDS[row["key"]], unit_of(row["key"])), row
        assert row["better"] == "yes" and (row["last"] > row["first"]) == higher_is_better(row["key"]), row
    report = next((log_dir / "owa_metrics" / "val" / "owa").glob("epoch_2_step_*.md")).read_text()
    excerpt = README.read_text().split("An excerpt:\n\n```text\n", 1)[1].split("```", 1)[0].splitlines()
    samples = report.split("## Samples", 1)[1].split("```", 2)[1].splitlines()
    assert excerpt[0].split() == samples[1].split() == list(SAMPLE_COLUMNS) and len(excerpt) >= 6
    rows = [line.split() for line in excerpt[1:] if line[:1].isdigit()]
    assert {row[3] for row in rows} == {"keyboard", "mouse_op", "mouse_nop", "screen"}  # every category in it
    assert all(row[2] in {status.label for status in Status} for row in rows)
