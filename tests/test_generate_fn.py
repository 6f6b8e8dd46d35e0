"""Every way a generate_fn returns its rows (issue 32): the prompt as given (left-padded, HF generate's output),
each row's own prompt (ragged lists or right-padded), or the new ids alone, are each read right as
``generate_output`` says, and "auto" reads only what one reading fits (issue 43 item 9); anything else stops the run
naming generate_fn."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from transformers.generation.utils import GenerateDecoderOnlyOutput

from owa_metrics.callbacks import OWAEventMetricsCallback
from lightning_fixtures import TinyLM, collate, event_sequences, report_of, reported
from oracles import expected_prompt


@pytest.fixture(scope="module")
def data(vocab):
    return event_sequences(vocab)


def _truth(data):
    sequences = [x["input_ids"].tolist() for x in data]

    def rows(input_ids, attention_mask):
        """Per prompt row: (its prompt as given, its own prompt, the true rest of its sequence)."""
        out = []
        for prompt, mask in zip(input_ids.tolist(), attention_mask.bool().tolist()):
            own = [t for t, m in zip(prompt, mask) if m]
            out.append((prompt, own, next(s for s in sequences if s[:len(own)] == own)[len(own):]))
        return out

    return rows


def _padded(rows, value=0):
    width = max(map(len, rows))
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def _validate(tmp_path, vocab, data, callbacks):
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        limit_val_batches=2)
    trainer.validate(TinyLM(vocab.size), DataLoader(data, batch_size=4, collate_fn=collate))
    return reported(trainer)  # every key of every callback, under its prefix


def test_each_output_shape_of_a_perfect_generate_fn_scores_perfect(tmp_path, tokenizer, vocab, data):
    truth = _truth(data)
    new = lambda rows: _padded([rest for _, _, rest in rows], tokenizer.pad_token_id)  # noqa: E731
    forms = {  # a perfect generator (the true rest of each row) in each shape a generate_fn may return, as said
        "left": lambda rows: _padded([p + rest for p, _, rest in rows]),  # HF generate: the prompts as given
        "dict": lambda rows: GenerateDecoderOnlyOutput(sequences=_padded([p + rest for p, _, rest in rows])),
        "own_lists": lambda rows: [own + rest for _, own, rest in rows],
        "own_padded": lambda rows: _padded([own + rest for _, own, rest in rows], tokenizer.pad_token_id),
        "new": new,
        "new_auto": new,  # no row begins with its prompt: "auto" reads the new ids alone
    }
    said = {"new": "new", "new_auto": "auto"}
    widths = set()

    def generate_fn(form):
        def generate(input_ids, attention_mask, max_new_tokens):
            widths.add(tuple(attention_mask.sum(1).tolist()))
            return forms[form](truth(input_ids, attention_mask))
        return generate

    callbacks = [OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=3, max_sequences=8,
                                         prefix=f"val/{form}/", generate_fn=generate_fn(form),
                                         generate_output=said.get(form, "prompt_and_new")) for form in forms]
    logged = _validate(tmp_path, vocab, data, callbacks)
    assert any(len(set(w)) > 1 for w in widths)  # prompts of different lengths in a batch: left != own padding
    reports = {form: {k: float(v) for k, v in report_of(logged, f"val/{form}/").items()} for form in forms}
    plain = reports["new"]  # the new ids alone: nothing to cut
    assert plain["count/sequences"] == 8 and plain["comparable_rate"] == 1.0 and plain["count_accuracy"] == 1.0
    for form, report in reports.items():
        assert report == plain, form


@pytest.mark.parametrize("returned, said, expected", [
    (lambda rows: [p + rest for p, _, rest in rows][:-1], "auto", r"got 3 rows for 4 prompt rows"),
    (lambda rows: [own + rest if i % 2 else rest for i, (_, own, rest) in enumerate(rows)], "auto",
     r"rows \[1, 3\] hold their prompt \(at columns \[0, 0\]\), rows \[0, 2\] do not"),
    (lambda rows: [own[1:] + rest for _, own, rest in rows], "auto",  # a prompt of its own (re-tokenized, say)
     r"rows of \d+ ids \(more than max_new_tokens=100\) hold none of the prompts given"),
    (lambda rows: _padded([p + rest for p, _, rest in rows]).float(), "auto",
     r"got Tensor of shape \(4, \d+\) / torch.float32"),
    (lambda rows: torch.tensor(rows[0][0] + rows[0][2]), "auto", r"got Tensor of shape \(\d+,\)"),
    (lambda rows: [rest[:50] for _, _, rest in rows], "prompt_and_new",  # said to hold the prompts: they do not
     r"no row holds its prompt; with generate_output='prompt_and_new' every row begins with its prompt"),
    (lambda rows: [own + rest for _, own, rest in rows], "new",  # said to be the new ids alone: too long for that
     r"rows of \d+ ids, more than max_new_tokens=100: with generate_output='new' each row is the new ids alone"),
], ids=["rows missing", "rows read two ways", "other prompts", "float", "1-D", "no prompts", "too long for new"])
def test_an_output_generate_fn_cannot_be_read_stops_the_run(tmp_path, tokenizer, vocab, data, returned, said,
                                                            expected):
    truth = _truth(data)
    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=3, max_new_tokens=100,
                                       generate_fn=lambda ids, mask, new: returned(truth(ids, mask)),
                                       generate_output=said)
    with pytest.raises(RuntimeError, match=r"cannot read what generate_fn returned at validation batch 0 \(\w+Error: "
                                           + expected + r".*\)\. generate_fn\(input_ids, attention_mask, "
                                           r"max_new_tokens\) must return one row per prompt row"):
        _validate(tmp_path, vocab, data, [callback])


def _repeating(vocab, data):
    """Rows of three actions each, cut (predict_events=2) into a one-action prompt and two to predict: rows 0 - 1
    (a, b, c), their first generated action not the prompt's; rows 2 - 7 (a, a, b), whose true continuation begins
    with the prompt's action again (issue 43 item 9). a, b, c: actions of the data, as token lists."""
    start, screen = vocab.ids["<EVENT_START>"], vocab.ids["<SCREEN>"]
    actions = []
    for item in data:  # every action event of the data, in order
        ids = item["input_ids"].tolist()
        bounds = [i for i, t in enumerate(ids) if t == start] + [len(ids)]
        actions += [ids[i:j] for i, j in zip(bounds, bounds[1:]) if ids[i + 1] != screen]
    rows = [actions[3 * r] + actions[3 * r + 1] + actions[3 * r + 2] for r in range(2)]
    rows += [actions[3 * r] * 2 + actions[3 * r + 1] for r in range(2, 8)]
    return [{"input_ids": torch.tensor(row), "labels": torch.tensor(row)} for row in rows]


def test_new_ids_that_repeat_the_prompt_are_read_as_generate_output_says(tmp_path, tokenizer, vocab, data):
    """A perfect generator of the new ids alone scores 1.0 where its rows repeat their prompt: said
    (generate_output="new"), or in "auto" where some rows do not (only the new-ids reading fits); where every row
    does, "auto" refuses, naming the setting. The truth by hand: 2 actions to predict a row, all of them right."""
    rows = _repeating(vocab, data)

    def perfect(input_ids, attention_mask, max_new_tokens, *, batch, cut):  # the true continuation, new ids alone
        return [[t for t in ids[c:].tolist() if t != -100] for ids, c in zip(batch["labels"], cut)]

    def validate(callbacks):
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=callbacks, enable_checkpointing=False, default_root_dir=tmp_path)
        trainer.validate(TinyLM(vocab.size), DataLoader(rows, batch_size=4, collate_fn=collate))
        return reported(trainer)

    said = dict(alignment="generation", predict_events=2, generate_fn=perfect)
    logged = validate([OWAEventMetricsCallback(tokenizer, **said, prefix="val/new/", generate_output="new"),
                       OWAEventMetricsCallback(tokenizer, **said, prefix="val/auto/", max_sequences=4)])  # batch 0
    for prefix, sequences in (("val/new/", 8), ("val/auto/", 4)):  # batch 0: 2 rows of each kind
        report = {k: float(v) for k, v in report_of(logged, prefix).items()}
        assert report["count/sequences"] == sequences and report["count/target_events"] == 2 * sequences
        assert report["count/pred_events"] == 2 * sequences
        assert report["count_accuracy"] == 1.0 and report["comparable_rate"] == 1.0, prefix
    auto = OWAEventMetricsCallback(tokenizer, **said)
    with pytest.raises(RuntimeError, match=r"validation batch 1 \(ValueError: every row begins with its prompt and "
                                           r"none is longer than max_new_tokens=160 ids.*generate_output='new'"):
        validate([auto])  # batch 1: every row repeats its prompt


def test_generation_fits_the_models_positions_with_the_defaults(tmp_path, tokenizer, vocab):
    """A GPT-2 of 256 positions (n_positions) validated on 256-token windows, the callback's defaults (issue 44
    item 2): max_new_tokens is 4 x 80 at most half the context, 128, and each prompt is its row cut before the last 4
    actions and then from the left, whole events kept, to 256 - 128 tokens (the oracle above)."""
    data = event_sequences(vocab, 256)[:8]
    module = TinyLM(vocab.size)
    assert module.model.config.n_positions == 256 and max(len(x["input_ids"]) for x in data) > 200
    calls, generate = [], module.model.generate

    def recording(*args, **kwargs):  # the real generate, its inputs kept
        calls.append(kwargs)
        return generate(*args, **kwargs)

    module.model.generate = recording
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[OWAEventMetricsCallback(tokenizer, alignment="generation")],
                        enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.validate(module, DataLoader(data, batch_size=4, collate_fn=collate))
    assert report_of(reported(trainer))["count/sequences"] == 8 and len(calls) == 2
    start, cuts = vocab.ids["<EVENT_START>"], 0
    for batch_idx, call in enumerate(calls):
        assert call["max_new_tokens"] == 128 and call["input_ids"].shape[1] + 128 <= 256
        for row, (ids, mask) in enumerate(zip(call["input_ids"], call["attention_mask"])):
            full = data[4 * batch_idx + row]["input_ids"].tolist()
            prompt, cut = expected_prompt(full, vocab, 4, 256 - 128)
            assert ids[mask.bool()].tolist() == prompt
            assert prompt[0] == start and (cut == len(full) or full[cut] == start)  # whole events
            cuts += len(prompt) < cut
    assert cuts > 0  # some prompts were cut from the left


@pytest.mark.parametrize("settings, expected", [
    (dict(max_new_tokens=250), r"the prompts get context_tokens - max_new_tokens = 256 - 250 = 6 tokens "
                               r"\(context_tokens from model.config.n_positions\), and the last event of row 0's "
                               r"prompt alone is \d+ tokens: give a smaller max_new_tokens="),
    (dict(context_tokens=300), r"context_tokens=300 is more than the model's model.config.n_positions=256"),
    (dict(context_tokens=200, generate_fn=lambda input_ids, attention_mask, max_new_tokens, *, batch, cut: None),
     r"cut from the left to fit the context.*give generate_fn a keyword argument start= too"),
], ids=["no room", "more than the model's", "generate_fn without start"])
def test_a_prompt_that_cannot_fit_stops_the_run_naming_the_numbers(tmp_path, tokenizer, vocab, settings, expected):
    """Caught in the sanity check, before the first training step."""
    data = event_sequences(vocab, 256)[:4]
    loader = DataLoader(data, batch_size=4, collate_fn=collate)
    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", **settings)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback], enable_checkpointing=False, default_root_dir=tmp_path, max_epochs=1)
    module = TinyLM(vocab.size)
    with pytest.raises((RuntimeError, ValueError), match=expected):
        trainer.fit(module, loader, loader)
    assert trainer.global_step == 0
