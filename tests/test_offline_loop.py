"""The offline loop end to end: a model's generate output -> `write_sequences` -> the files `owa-metrics evaluate`
reads -> the report; and the warning when the two files are in different token formats."""

import json
import warnings

import pytest
import torch

from owa_metrics import VocabMap, build_tokenizer
from owa_metrics.cli import main
from owa_metrics.offline.evaluate import FormatMismatchWarning, evaluate, write_sequences
from owa_metrics.events import simulate_session

PROMPT_EVENTS = 3  # events of each row given as the prompt


def _rows(format: str):
    tokenizer = build_tokenizer(format=format)
    vocab = VocabMap.from_tokenizer(tokenizer)
    rows = vocab.encode_sequences(simulate_session(12.0, seed=1, format=format), 300)[:4]
    width = min(map(len, rows))
    return tokenizer, vocab, torch.tensor([row[:width] for row in rows])


def test_generate_output_to_the_file_evaluate_reads(tmp_path):
    """A perfect model's generate output (left-padded prompts of 3 events, the true continuation, eos, padding), one
    row stopping an event early: what the report says is counted by hand from the events."""
    tokenizer, vocab, _ = _rows("hierarchical")
    rows = vocab.encode_sequences(simulate_session(12.0, seed=1), 300)[:4]
    pad, eos, end = tokenizer.pad_token_id, tokenizer.eos_token_id, vocab.ids[vocab.config.event_end]
    cut = [[i for i, t in enumerate(row) if t == end][PROMPT_EVENTS - 1] + 1 for row in rows]
    prompts, truth = [row[:c] for row, c in zip(rows, cut)], [row[c:] for row, c in zip(rows, cut)]
    width, longest = max(map(len, prompts)), max(map(len, truth))
    generated = [list(t) for t in truth]
    generated[3] = generated[3][:[i for i, t in enumerate(generated[3]) if t == end][-2] + 1]  # one event less
    out = torch.tensor([[pad] * (width - len(p)) + p + g + [eos] + [pad] * (longest - len(g))
                        for p, g in zip(prompts, generated)])  # what model.generate returns for the batch
    write_sequences(tmp_path / "pred.jsonl", out[:, width:], tokenizer)
    write_sequences(tmp_path / "true.jsonl", truth, tokenizer, tags=["game", "game", "editor", "editor"])
    lines = [json.loads(line) for line in (tmp_path / "true.jsonl").read_text().splitlines()]
    assert [line["tag"] for line in lines] == ["game", "game", "editor", "editor"]
    assert lines[0]["text"] == "".join(tokenizer.convert_ids_to_tokens(truth[0]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one format, every event whole: no warning
        report = evaluate(tmp_path / "pred.jsonl", tmp_path / "true.jsonl", progress=False)
    start, screen = vocab.ids[vocab.config.event_start], vocab.ids[vocab.config.screen_token]
    events = sum(a == start and b != screen for row in truth for a, b in zip(row, row[1:]))  # actions: screens are
    # context by default (the dropped event of row 3 is an action)
    assert report["count/target_events"] == events and report["count/missing_events"] == 1
    assert report["count_accuracy"] == 3 / 4 and report["comparable_rate"] == pytest.approx((events - 1) / events)
    assert report["tag/game/comparable_rate"] == 1.0 and report["tag/editor/count/sequences"] == 2


def test_files_in_two_formats_are_said(tmp_path, capsys):
    """The same events, the predictions written by a factorized tokenizer, the targets by a hierarchical one."""
    hierarchical, _, truth = _rows("hierarchical")
    factorized, _, pred = _rows("factorized")
    write_sequences(tmp_path / "pred.txt", pred, factorized)
    write_sequences(tmp_path / "true.txt", truth, hierarchical)
    with pytest.warns(FormatMismatchWarning, match="pred.txt looks factorized but .*true.txt looks hierarchical"):
        report = evaluate(tmp_path / "pred.txt", tmp_path / "true.txt", progress=False)
    assert report["comparable_rate"] < 1  # read as the target's format: only the screens decode alike
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"),
                 "--strict"]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "looks factorized" in line]
    assert len(said) == 1 and "true.txt looks hierarchical" in said[0] and said[0].startswith("owa-metrics evaluate")
