"""Screens in generation (issue 32, item 1): the model is shown the screens and predicts the actions, so by default a
generated sequence is scored on its actions alone; ``generated_screens="scored"`` scores screens as before."""

import pytest
import torch

from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer
from owa_metrics.decode.screens import without_screen_events
from owa_metrics.events import simulate_session
from owa_metrics.schema import Role

SPANS = ("image_tokens", "empty", "junk")
PAIRINGS = ("index", "time")


@pytest.fixture(scope="module", params=["hierarchical", "factorized"])
def sessions(request):
    """(vocab, [(events of a sequence, each event's image-token ids and label ids)]): 4 sequences of 24 events
    of a simulated session, its screens at 10 Hz."""
    vocab = VocabMap.from_tokenizer(build_tokenizer(format=request.param))
    events = simulate_session(12, seed=3, format=request.param)
    return vocab, [events[i:i + 24] for i in range(0, 96, 24)]


def _generated(vocab, events, span):
    """The true events' ids, each screen's image span (its image tokens) as ``span`` says: kept, left out, or junk
    (tokens of no event)."""
    junk = [vocab.ids["<MOUSE>"], 1, 1]  # a type token and <unk>s: never a screen's data
    out = []
    for e in events:
        ids = vocab.encode([e])
        if e.kind == "screen" and span != "image_tokens":
            roles = (vocab.codes(torch.tensor(ids)) & 0xF).tolist()
            data = [i for i, r in enumerate(roles) if r == int(Role.IMAGE)]
            ids = ids[:data[0]] + (junk if span == "junk" else []) + ids[data[-1] + 1:]
        out += ids
    return out


def _pad(rows):
    width = max(map(len, rows))
    return torch.tensor([r + [-100] * (width - len(r)) for r in rows])


def _report(vocab, sequences, span, pairing, **kwargs):
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", pairing=pairing, **kwargs)
    metric.update(_pad([_generated(vocab, s, span) for s in sequences]),
                  _pad([vocab.encode(s, ignore_images=True) for s in sequences]))
    return {k: float(v) for k, v in metric.compute().items()}


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_a_generator_that_writes_the_true_actions_scores_one(sessions, span, pairing):
    vocab, sequences = sessions
    report = _report(vocab, sequences, span, pairing)
    assert report["comparable_rate"] == 1.0 and report["count_accuracy"] == 1.0
    assert report["category/macro_f1"] == 1.0
    if pairing == "time":
        assert report["detect/f1"] == 1.0
    actions = sum(e.kind != "screen" for s in sequences for e in s)
    assert report["count/target_events"] == actions == report["count/pred_events"]
    assert not [k for k in report if k.startswith(("screen/", "detect/screen/"))]


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_actions_alone_score_one_too(sessions, pairing):
    """A generator that writes no screen at all (it is shown them)."""
    vocab, sequences = sessions
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", pairing=pairing)
    metric.update(_pad([vocab.encode([e for e in s if e.kind != "screen"]) for s in sequences]),
                  _pad([vocab.encode(s, ignore_images=True) for s in sequences]))
    report = metric.compute()
    assert report["comparable_rate"] == 1.0 and report["count_accuracy"] == 1.0
    assert pairing == "index" or report["detect/f1"] == 1.0


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_scored_screens_count_as_before(sessions, span, pairing):
    """``generated_screens="scored"``: a screen whose image span holds no image token does not decode (empty:
    missing_fields, junk: invalid_format), so with A actions and S screens every rate counts it as a miss."""
    vocab, sequences = sessions
    report = _report(vocab, sequences, span, pairing, generated_screens="scored")
    screens = sum(e.kind == "screen" for s in sequences for e in s)
    actions = sum(e.kind != "screen" for s in sequences for e in s)
    assert screens > 0 and report["count/target_events"] == actions + screens and "screen/count" in report
    if span == "image_tokens":
        assert report["comparable_rate"] == 1.0 and report["screen/comparable_rate"] == 1.0
        assert pairing == "index" or report["detect/f1"] == 1.0
        return
    assert report["comparable_rate"] == pytest.approx(actions / (actions + screens), abs=1e-12)
    assert report["screen/comparable_rate"] == 0.0
    # by index each true screen is paired with its undecoded copy; by time that copy pairs with nothing
    status = "missing" if pairing == "time" else "missing_fields" if span == "empty" else "invalid_format"
    assert report[f"status/{status}"] == screens
    if pairing == "time":  # the micro scores count the undecoded generated screens as false positives
        assert report["detect/f1"] == pytest.approx(2 * actions / (2 * actions + screens), abs=1e-12)
    else:  # each sequence still has its events' count
        assert report["count_accuracy"] == 1.0


def test_screen_events_are_taken_out_whatever_their_span(sessions):
    """By hand: each screen event's tokens, from its <EVENT_START> through its <EVENT_END> (an unclosed one up to the
    next <EVENT_START> or the row's end), read as ignored labels; the rest stays where it is."""
    vocab, sequences = sessions
    s, e, scr = vocab.ids["<EVENT_START>"], vocab.ids["<EVENT_END>"], vocab.ids["<SCREEN>"]
    key = vocab.encode([x for x in sequences[0] if x.kind != "screen"][:2])
    n = len(key)
    rows = [[1, s, scr, 2, e] + key + [s, scr, 1, 1] + key, [s, scr, e, -100, s, scr, 2, 2] + [-100] * (2 * n + 1)]
    want = [[1] + [-100] * 4 + key + [-100] * 4 + key, [-100] * (2 * n + 9)]
    assert without_screen_events(torch.tensor(rows), vocab).tolist() == want
    assert without_screen_events(torch.tensor(rows), vocab, compiled=True).tolist() == want


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_hostile_ids_with_screens_as_context_never_raise(sessions, backend):
    """Random ids (event tokens, ignored labels, ids past the vocabulary) and corrupted true sequences: the masking only
    ever writes -100, twice is once, and the default generation metric reports no NaN on either decoder."""
    vocab, sequences = sessions
    g = torch.Generator().manual_seed(0)
    true = _pad([vocab.encode(s, ignore_images=True) for s in sequences])
    noise = torch.randint(-1, vocab.size + 3, true.shape, generator=g)
    hostile = torch.where(torch.rand(true.shape, generator=g) < 0.2, torch.where(noise < 0, -100, noise), true)
    masked = without_screen_events(hostile, vocab)
    assert bool(((masked == hostile) | (masked == -100)).all())
    assert torch.equal(without_screen_events(masked, vocab), masked)
    assert torch.equal(without_screen_events(hostile, vocab, compiled=True), masked)  # the compiled pass: the same
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", backend=backend)
    metric.update(hostile, true)
    metric.update(true, hostile)
    assert all(not bool(torch.isnan(v)) for v in metric.compute().values())


def test_scored_ids_each_side_alone_equal_both_padded_together(sessions):
    """The CPU kernel path masks each side on its own (no padded copy of both): the same ids as the torch path's one
    pass over both sides padded to one width, on sides of different widths with screens cut at either row end."""
    vocab, sequences = sessions
    g = torch.Generator().manual_seed(1)
    true = _pad([vocab.encode(s, ignore_images=True) for s in sequences])
    noise = torch.randint(-1, vocab.size + 3, true.shape, generator=g)
    hostile = torch.where(torch.rand(true.shape, generator=g) < 0.2, torch.where(noise < 0, -100, noise), true)
    metrics = [OWAEventMetrics(vocab=vocab, alignment="generation", backend=b) for b in ("torch", "kernel")]
    for preds, target in ((hostile[:, :-7], true), (true, hostile[:, :-7]), (hostile[:, :1], true[:, :40])):
        want, got = (m.scored_ids(preds, target) for m in metrics)
        assert [x.shape for x in got] == [preds.shape, target.shape]
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_predict_events_counts_actions_when_screens_are_context():
    """The prompt ends before the last ``predict_events`` actions (screens are context, not predicted): with
    events [key, screen, mouse, screen, screen] and predict_events=1 the cut is at the mouse event's start (the
    continuation holds an action); counting every event (screens scored) cuts at the last screen."""
    from owa_metrics.callbacks.generation import split_prompt
    from owa_metrics.schema import Event

    vocab = VocabMap.from_tokenizer(build_tokenizer())
    events = [Event("keyboard", 10_000_000, vk=65, action="press"), Event("screen", 20_000_000),
              Event("mouse", 30_000_000, dx=3, dy=-2, button_flags=0), Event("screen", 40_000_000),
              Event("screen", 50_000_000)]
    pieces = [vocab.encode([e], ignore_images=True) for e in events]
    ids = torch.tensor([sum(pieces, [])])
    starts = [sum(map(len, pieces[:i])) for i in range(len(pieces))]  # each event's first token, by hand
    assert split_prompt(ids, ids, vocab, 1)[3].tolist() == [starts[2]]
    assert split_prompt(ids, ids, vocab, 2)[3].tolist() == [starts[2]]  # the first action stays as context
    assert split_prompt(ids, ids, vocab, 1, actions_only=False)[3].tolist() == [starts[4]]
    # a row with no action to predict is its prompt whole, never its padding: its cut is its length in any batch
    only_screens = sum(pieces[3:], [])
    ids = torch.tensor([sum(pieces, []), only_screens + [0] * (len(sum(pieces, [])) - len(only_screens))])
    mask = torch.tensor([[1] * ids.shape[1], [1] * len(only_screens) + [0] * (ids.shape[1] - len(only_screens))])
    assert split_prompt(ids, ids, vocab, 1, attention_mask=mask)[3].tolist() == [starts[2], len(only_screens)]
