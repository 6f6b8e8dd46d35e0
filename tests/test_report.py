"""What a person reads: sample rows of known pairs, the histogram range, the confusion figure."""

import numpy as np
import pytest
import torch

from owa_metrics import Event, OWAEventMetrics, decode_batch
from owa_metrics.report import SAMPLE_COLUMNS, sample_note, sample_rows, sample_table

TRUE = [Event("mouse", 1_230_000_000, dx=-3, dy=64), Event("keyboard", 1_500_000_000, vk=65, action="press"),
        Event("mouse", 2_000_000_000, dx=0, dy=0, button_flags=0x001),
        Event("mouse", 2_100_000_000, dx=0, dy=0, button_flags=0x400, button_data=120),
        Event("screen", 3_000_000_000), Event("mouse", 3_100_000_000, dx=5, dy=7),
        Event("keyboard", 3_500_000_000, vk=13, action="release")]
PRED = [Event("mouse", 1_250_000_000, dx=-5, dy=60), Event("keyboard", 1_490_000_000, vk=66, action="press"),
        Event("mouse", 2_000_000_000, dx=0, dy=0, button_flags=0x002),
        Event("mouse", 2_100_000_000, dx=0, dy=0, button_flags=0x400, button_data=-120),
        Event("screen", 3_000_000_000), Event("mouse", 3_100_000_000, dx=5, dy=7),
        Event("mouse", 3_500_000_000, dx=0, dy=0)]
EXPECTED = [
    ["0", "0", "valid", "mouse_nop 1.23 s dx -3 dy +64", "mouse_nop 1.25 s dx -5 dy +60",
     "Δt +20 ms, Δ (-2, -4) px, dir 2.1°"],  # atan(3/64) = 2.68°, atan(5/60) = 4.76°
    ["0", "1", "valid", "keyboard 1.50 s key 65 (A) press", "keyboard 1.49 s key 66 (B) press",
     "Δt -10 ms, key wrong, action right"],
    ["0", "2", "valid", "mouse_op 2.00 s dx +0 dy +0 left down", "mouse_op 2.00 s dx +0 dy +0 left up",
     "Δt +0 ms, Δ (+0, +0) px, buttons wrong"],
    ["0", "3", "valid", "mouse_op 2.10 s dx +0 dy +0 wheel +1", "mouse_op 2.10 s dx +0 dy +0 wheel -1",
     "Δt +0 ms, Δ (+0, +0) px, buttons right, wheel wrong"],
    ["0", "4", "valid", "screen 3.00 s", "screen 3.00 s", "Δt +0 ms"],
    ["0", "5", "missing_fields", "mouse_nop 3.10 s dx +5 dy +7", "<EVENT_START><MOUSE><3><1><0><EVENT_END>", "–"],
    ["0", "6", "type_mismatch", "keyboard 3.50 s key 13 (Enter) release", None, "–"],
]
# a mouse event's first 8 tokens where the keyboard event stands (teacher forcing decodes at the target's span)
MISMATCH = {"hierarchical": "<EVENT_START><MOUSE><3><5><0><0><0><0>",
            "factorized": "<EVENT_START><MOUSE><3><5><0><SIGN_PLUS><0><0>"}


def _pair(vocab):
    """Target and prediction ids aligned position by position: PRED's tokens cut to each true event's length,
    the sixth predicted event ended after its timestamp."""
    end = vocab.ids["<EVENT_END>"]
    target, preds = [], []
    for k, (true, pred) in enumerate(zip(TRUE, PRED)):
        t, p = vocab.encode([true], ignore_images=True), vocab.encode([pred])
        if k == 5:
            p = p[:5] + [end] + p[6:]
        target += t
        preds += p[:len(t)]
    return torch.tensor([preds]), torch.tensor([target])


def test_sample_rows_of_a_known_pair_read_as_events_in_words(format_vocab):
    preds, target = _pair(format_vocab)
    rows = sample_rows(decode_batch(preds, target, format_vocab), preds, target, format_vocab)
    expected = [row[:4] + [MISMATCH[format_vocab.config.format] if row[4] is None else row[4]] + row[5:]
                for row in EXPECTED]
    assert rows == expected
    table = sample_table(rows).splitlines()
    assert table[0] == table[-1] == "```" and table[1].split() == list(SAMPLE_COLUMNS)
    assert table[3].index("keyboard 1.50 s") == table[1].index("true")  # aligned columns
    narrow = sample_table(rows, max_width=24).splitlines()  # a wide cell continues on the next line, between tokens
    at, k = narrow[1].index("predicted"), next(i for i, line in enumerate(narrow) if "missing_fields" in line)
    assert narrow[k][at:].startswith("<EVENT_START><MOUSE>") and narrow[k + 1][at:].startswith("<")
    assert narrow[k + 1][:narrow[1].index("true")].strip() == ""  # a continuation line
    assert "".join(line[at:].split("  ")[0] for line in narrow[k:k + 3]).startswith(rows[5][4])


def test_sample_rows_in_generation_name_missing_events_and_cut_undecodable_ones_at_their_end(vocab):
    target = torch.tensor([vocab.encode(TRUE[:2], ignore_images=True)])
    garbage = vocab.encode(PRED[:1])[:4] + [vocab.ids["<EVENT_END>"], vocab.ids["<press>"], vocab.ids["<press>"]]
    preds = torch.tensor([garbage])
    rows = sample_rows(decode_batch(preds, target, vocab, "generation"), preds, target, vocab)
    assert rows == [["0", "0", "missing_fields", "mouse_nop 1.23 s dx -3 dy +64", "<EVENT_START><MOUSE><1><2><EVENT_END>",
                     "–"],
                    ["0", "1", "missing", "keyboard 1.50 s key 65 (A) press", "(no event)", "–"]]


def test_sample_rows_show_every_category_present_not_only_the_first_events(format_vocab):
    """Ten moves, a key press, four moves, a click, a screen; 6 rows: the categories take turns (keyboard,
    mouse_op, mouse_nop, screen), so the key, the click and the screen show next to the first three moves."""
    moves = [Event("mouse", 100_000_000 * (k + 1), dx=k + 1, dy=-1) for k in range(14)]
    events = [*moves[:10], Event("keyboard", 1_050_000_000, vk=65, action="press"), *moves[10:],
              Event("mouse", 1_450_000_000, dx=0, dy=0, button_flags=0x001), Event("screen", 1_500_000_000)]
    ids = torch.tensor([format_vocab.encode(events, ignore_images=True)])
    rows = sample_rows(decode_batch(ids, ids, format_vocab), ids, ids, format_vocab, max_rows=6)
    assert [row[1] for row in rows] == ["0", "1", "2", "10", "15", "16"]
    assert [row[3].split()[0] for row in rows] == ["mouse_nop"] * 3 + ["keyboard", "mouse_op", "screen"]
    assert rows[3][3] == "keyboard 1.05 s key 65 (A) press" and rows[4][3] == "mouse_op 1.45 s dx +0 dy +0 left down"
    assert len(sample_rows(decode_batch(ids, ids, format_vocab), ids, ids, format_vocab)) == len(events)  # 17 <= 24


def test_the_sample_note_says_what_a_run_is_and_which_window_times_are_in(format_vocab):
    note = sample_note(format_vocab.config)
    window = {"hierarchical": "16 s", "factorized": "10 s"}[format_vocab.config.format]  # 1600 / 1000 x 10 ms
    assert f"within the format's {window} timestamp window" in note and "`<t>×N`: a run of N identical tokens" in note


@pytest.mark.parametrize("tails", ["heavy", "none"])
def test_histograms_show_the_bulk_and_count_the_outliers_in_the_edge_bins(vocab, tails):
    rng = np.random.default_rng(0)
    draws = rng.standard_t(2, size=300) * 3 if tails == "heavy" else rng.uniform(-50, 50, size=300)
    shifts_ms = np.round(draws) * 10  # on the 10 ms grid
    true = [Event("screen", 4_000_000_000 + 20_000_000 * k) for k in range(300)]
    pred = [Event("screen", e.timestamp_ns + int(s * 1e6)) for e, s in zip(true, shifts_ms)]
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", generated_screens="scored")
    metric.update(torch.tensor([vocab.encode(pred, ignore_images=True)]),
                  torch.tensor([vocab.encode(true, ignore_images=True)]))
    counts, edges = metric.error_histograms()["timestamp/signed_error_ms"]
    p2, q1, q3, p98 = np.quantile(shifts_ms, [0.02, 0.25, 0.75, 0.98])
    fences = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)  # Tukey's: narrower than P2..P98 for heavy tails only
    assert (p2 < fences[0] and fences[1] < p98) == (tails == "heavy")
    assert edges[0] == pytest.approx(max(p2, fences[0])) and edges[-1] == pytest.approx(min(p98, fences[1]))
    assert counts.sum() == 300 and len(counts) == 50
    assert (shifts_ms < edges[0]).sum() > 0 and (shifts_ms > edges[-1]).sum() > 0
    assert counts[0] == (shifts_ms < edges[1]).sum() and counts[-1] == (shifts_ms >= edges[-2]).sum()


def test_the_confusion_figure_is_titled_rated_by_row_and_writes_counts_in_contrasting_colours():
    from matplotlib.colors import to_rgb

    from owa_metrics.callbacks.artifacts import confusion_figure

    confusion = torch.tensor([[9.0, 0, 1, 0, 0], [0, 0, 0, 0, 2], [30, 0, 1418, 0, 52], [0, 0, 0, 40, 0]])
    figure = confusion_figure(confusion, "category confusion, epoch 3")
    ax = figure.axes[0]
    assert "epoch 3" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["keyboard", "mouse_op", "mouse_nop", "screen"]
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "invalid"
    cells = {t.get_text(): to_rgb(t.get_color()) for t in ax.texts}
    assert cells["1,418\n95%"] == (1, 1, 1) and cells["2\n100%"] == (1, 1, 1)  # dark cells: white text
    assert cells["52\n3%"] == (0, 0, 0) and cells["9\n90%"] == (1, 1, 1) and cells["1\n10%"] == (0, 0, 0)
    image = ax.get_images()[0].get_array()
    assert image[1, 4] == 1.0 and image[2, 2] == pytest.approx(1418 / 1500)  # coloured by the row's share
    width_px = figure.get_size_inches()[0] * figure.dpi
    assert 280 <= width_px <= 340  # whole in TensorBoard's image card (issue 35: 600 px overflowed it)
    texts = [*ax.texts, *ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label, ax.title]
    assert min(t.get_fontsize() for t in texts) * figure.dpi / 72 >= 9.5  # text at least ~10 px high


def test_the_metrics_doc_names_each_key_in_the_reports_words():
    """docs/METRICS.md's table of names is `WORDS` (key -> words), with each key's unit and direction; the markdown
    report's headline and the demo's table read the same table."""
    from pathlib import Path

    from owa_metrics.demo import COMPARED
    from owa_metrics.functional.report import HEADLINE, WORDS, higher_is_better
    from owa_metrics.report import unit_of

    text = (Path(__file__).resolve().parents[1] / "docs" / "METRICS.md").read_text()
    table = text.split("## Names", 1)[1].split("| key | words | unit | better |", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()[1:]]
    better = {"higher": True, "lower": False, "–": None}
    assert {row[0].strip("`"): (row[1], row[2], better[row[3]]) for row in rows} == {
        key: (words, unit_of(key), higher_is_better(key)) for key, words in WORDS.items()}
    assert len(rows) == len(WORDS) and all(WORDS[key] == words for key, words, _, _ in HEADLINE)
    assert set(COMPARED) <= set(WORDS)
