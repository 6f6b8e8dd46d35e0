import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from owa_metrics import Category, Event, EventCodec, Status, align_teacher_forcing, decode_batch, reference_decode
from oracles import batch_rows

KEY = Event(kind="keyboard", timestamp_ns=1_230_000_000, vk=65, action="press")
MOVE = Event(kind="mouse", timestamp_ns=1_500_000_000, dx=-3, dy=64)
CLICK = Event(kind="mouse", timestamp_ns=1_600_000_000, dx=0, dy=0, button_flags=0x001)
WHEEL = Event(kind="mouse", timestamp_ns=1_700_000_000, dx=0, dy=0, button_flags=0x400, button_data=-120)
SCREEN = Event(kind="screen", timestamp_ns=2_000_000_000)


def pad(rows, value=-100):
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def test_perfect_predictions_decode_to_the_events(vocab):
    target = torch.tensor([vocab.encode([KEY, MOVE, CLICK, WHEEL, SCREEN])])
    batch = decode_batch(target.clone(), target, vocab)
    assert batch.status.tolist() == [Status.VALID] * 5
    assert batch.target.category.tolist() == [Category.KEYBOARD, Category.MOUSE_NOP, Category.MOUSE_OP,
                                              Category.MOUSE_OP, Category.SCREEN]
    assert batch.pred.timestamp_ns.tolist() == [1_230_000_000, 1_500_000_000, 1_600_000_000, 1_700_000_000,
                                                2_000_000_000]
    assert batch.pred.dx.tolist() == [0, -3, 0, 0, 0] and batch.pred.dy.tolist() == [0, 64, 0, 0, 0]
    assert batch.pred.button_data.tolist() == [0, 0, 0, -120, 0]
    assert batch.pred.vk.tolist()[0] == 65 and batch.pred.action.tolist()[0] == 0
    assert batch.target.timestamp_digits.tolist()[0] == [1, 2, 3]
    assert batch.target.dx_digits.tolist()[1] == [1, 19, 9, 7] and batch.target.dy_digits.tolist()[1] == [0, 0, 6, 4]
    assert batch.target.start.tolist() == [0, 8, 25, 42, 61] and batch.target.end.tolist()[-1] == 61 + 72


def test_factorized_worked_examples_decode_in_a_batch():
    """The issue's upstream strings, tokenized and decoded by the batch decoder: values and digit levels."""
    from owa_metrics import VocabMap, build_tokenizer

    tokenizer = build_tokenizer(format="factorized")
    vocab = VocabMap.from_tokenizer(tokenizer)
    text = ("<EVENT_START><MOUSE><3><1><8><SIGN_MINUS><0><0><3><7><SIGN_PLUS><0><0><3><4><MB_0><MB_0><MB_0><EVENT_END>"
            "<EVENT_START><MOUSE><6><9><5><SIGN_MINUS><0><3><0><0><SIGN_PLUS><0><2><5><0><MB_4><MB_0><MB_2>"
            "<SIGN_MINUS><3><EVENT_END><EVENT_START><KEYBOARD><0><0><5><VK_65><press><EVENT_END>")
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    batch = decode_batch(ids, ids, vocab)
    assert batch.status.tolist() == [Status.VALID] * 3
    t = batch.target
    assert t.timestamp_ns.tolist() == [3_180_000_000, 6_950_000_000, 50_000_000]
    assert t.dx.tolist() == [-37, -300, 0] and t.dy.tolist() == [34, 250, 0]
    assert t.button_flags.tolist() == [0, 0x402, 0] and t.button_data.tolist() == [0, -360, 0]
    assert t.vk.tolist()[2] == 65 and t.action.tolist()[2] == 0
    assert t.dx_digits.tolist()[0] == [1, 0, 0, 3, 7] and t.dy_digits.tolist()[1] == [0, 0, 2, 5, 0]
    assert t.timestamp_digits.tolist()[2] == [0, 0, 5]
    assert t.category.tolist() == [Category.MOUSE_NOP, Category.MOUSE_OP, Category.KEYBOARD]
    # minus zero is zero: its sign level reads as <SIGN_PLUS>, as the string reference re-encodes it
    minus_zero = tokenizer("<EVENT_START><MOUSE><0><0><0><SIGN_MINUS><0><0><0><0><SIGN_MINUS><0><0><0><5>"
                           "<MB_0><MB_0><MB_0><EVENT_END>")["input_ids"]
    for backend in ("kernel", "torch"):
        got = decode_batch(torch.tensor([minus_zero]), torch.tensor([minus_zero]), vocab, backend=backend).target
        assert got.dx.tolist() == [0] and got.dx_digits.tolist() == [[0, 0, 0, 0, 0]], backend
        assert got.dy.tolist() == [-5] and got.dy_digits.tolist() == [[1, 0, 0, 0, 5]], backend


def test_teacher_forcing_shift_keeps_the_first_event(vocab):
    ids = torch.tensor([vocab.encode([KEY, MOVE])])
    labels = ids.clone()
    perfect_logits = torch.nn.functional.one_hot(torch.roll(ids, -1, 1), vocab.size).float()
    preds, target = align_teacher_forcing(perfect_logits, labels)
    assert target.shape == (1, ids.shape[1] - 1) and target[0, 0].item() == vocab.ids["<KEYBOARD>"]
    batch = decode_batch(preds, target, vocab)
    assert batch.status.tolist() == [Status.VALID, Status.VALID]
    assert batch.pred.vk.tolist() == [65, 0] and batch.pred.dy.tolist() == [0, 64]
    assert batch.target.start.tolist() == [0, 7]


def test_ignored_image_labels_and_garbage_predictions_there(vocab):
    target = torch.tensor([vocab.encode([SCREEN, KEY], ignore_images=True)])
    assert (target == -100).sum() == 67
    preds = torch.where(target == -100, vocab.ids["<press>"], target)  # the model's guesses at ignored positions
    batch = decode_batch(preds, target, vocab)
    assert batch.status.tolist() == [Status.VALID, Status.VALID]
    assert batch.pred.category.tolist() == [Category.SCREEN, Category.KEYBOARD]


def test_malformed_predictions_are_rows_with_a_status(vocab):
    target = torch.tensor([vocab.encode([KEY, MOVE, KEY, SCREEN])])
    preds = target.clone()
    preds[0, 5] = vocab.ids["<release>"]  # vk slot holds a non-digit
    preds[0, 9] = vocab.ids["<KEYBOARD>"]  # the mouse event is predicted as a keyboard one (too short)
    preds[0, 25 + 1] = vocab.ids["<MOUSE>"]  # the second keyboard event predicted as mouse: <65> is no sign digit
    preds[0, 33 + 6] = vocab.ids["<EVENT_END>"]  # the screen's image data ends early
    batch = decode_batch(preds, target, vocab)
    # a type token of another kind is a type mismatch whatever follows it (teacher forcing)
    assert batch.status.tolist() == [Status.INVALID_FORMAT, Status.TYPE_MISMATCH, Status.TYPE_MISMATCH,
                                     Status.INVALID_FORMAT]
    assert batch.pred.status.tolist() == [Status.INVALID_FORMAT] * 4
    assert batch.pred.kind.tolist() == [0, 0, 1, 2] and batch.pred.category.tolist() == [Category.INVALID] * 4
    assert batch.target.status.tolist() == [Status.VALID] * 4
    from owa_metrics.functional.report import event_type_sums

    confusion = event_type_sums(batch)[0]  # rows: target category; the mismatches in their type's column
    assert confusion[Category.MOUSE_NOP, Category.KEYBOARD] == 1 and confusion[Category.KEYBOARD, Category.MOUSE_NOP] == 1
    assert confusion[Category.KEYBOARD, Category.INVALID] == 1 and confusion[Category.SCREEN, Category.INVALID] == 1


def test_generation_pairs_by_index_and_counts_extra_and_missing(vocab):
    target = pad([vocab.encode([KEY, MOVE, CLICK]), vocab.encode([KEY, SCREEN])])
    gen = pad([vocab.encode([KEY, CLICK, MOVE, KEY]), vocab.encode([MOVE])[:-3]], value=0)  # <pad>
    batch = decode_batch(gen, target, vocab, alignment="generation")
    assert batch.seq_idx.tolist() == [0, 0, 0, 1, 1]
    assert batch.target_count.tolist() == [3, 2] and batch.pred_count.tolist() == [4, 1]
    # a generated event cut by padding tokens is malformed, not missing; the last target has no partner
    assert batch.status.tolist() == [Status.VALID, Status.VALID, Status.VALID, Status.INVALID_FORMAT, Status.MISSING]
    assert batch.pred.button_flags.tolist()[:3] == [0, 1, 0]
    assert batch.pred.start.tolist()[-1] == -1


def test_wrong_kind_is_a_type_mismatch_and_bad_targets_are_counted(vocab):
    target = pad([vocab.encode([KEY]), vocab.encode([KEY])[:4] + vocab.encode([SCREEN])])
    gen = pad([vocab.encode([MOVE]), vocab.encode([KEY, SCREEN])])
    batch = decode_batch(gen, target, vocab, alignment="generation")
    assert batch.status.tolist() == [Status.TYPE_MISMATCH, Status.INVALID_TARGET, Status.VALID]
    assert batch.target.status.tolist() == [Status.VALID, Status.TRUNCATED, Status.VALID]


def test_misuse_raises_clear_errors(vocab):
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(TypeError, match="align_teacher_forcing"):
        decode_batch(torch.zeros(2, 5, 7), ids, vocab)
    with pytest.raises(ValueError, match="same shape"):
        decode_batch(torch.zeros(2, 4, dtype=torch.long), ids, vocab)
    with pytest.raises(ValueError, match="alignment"):
        decode_batch(ids, ids, vocab, alignment="beam")
    with pytest.raises(ValueError, match=r"\[batch, seq_len\]"):
        decode_batch(ids[None], ids[None], vocab)


# ------------------------------------------------------------------ agreement with the string reference
events = st.one_of(
    st.builds(Event, kind=st.just("keyboard"), timestamp_ns=st.integers(0, 10**11),
              vk=st.integers(0, 255), action=st.sampled_from(["press", "release"])),
    st.builds(Event, kind=st.just("mouse"), timestamp_ns=st.integers(0, 10**11),
              dx=st.integers(-2100, 2100), dy=st.integers(-2100, 2100),
              button_flags=st.sampled_from([0, 0, 1, 2, 0x400, 0xFFF]),
              button_data=st.sampled_from([0, 0, 120, -120, 1080, -1200])),
    st.builds(Event, kind=st.just("screen"), timestamp_ns=st.integers(0, 10**11)),
)


@st.composite
def corrupted(draw, vocab, ids):
    """Random edits: replace / delete / insert tokens, ignored runs, truncation."""
    ids = list(ids)
    named = sorted(vocab.ids.values())
    pool = st.one_of(st.integers(0, vocab.size - 1), st.sampled_from(named[:12]), st.sampled_from(named))
    signs = [vocab.ids[t] for t in vocab.config.sign_tokens if t in vocab.ids]
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["replace", "delete", "insert", "ignore", "truncate", "swap_sign"]))
        if not ids and op != "insert":
            continue
        at = draw(st.integers(0, max(len(ids) - 1, 0)))
        if op == "replace":
            ids[at] = draw(pool)
        elif op == "delete":
            del ids[at]
        elif op == "insert":
            ids.insert(at, draw(pool))
        elif op == "swap_sign":  # factorized: <SIGN_PLUS> <-> <SIGN_MINUS>; hierarchical: any named token
            hits = [i for i, t in enumerate(ids) if t in signs]
            if hits:
                i = draw(st.sampled_from(hits))
                ids[i] = signs[1 - signs.index(ids[i])]
            else:
                ids[at] = draw(st.sampled_from(named))
        elif op == "ignore":
            ids[at:at + draw(st.integers(1, 5))] = [-100] * len(ids[at:at + 5])
        else:
            ids = ids[:at]
    return ids


@st.composite
def batches(draw, vocab, alignment):
    targets, preds = [], []
    fit = EventCodec(vocab.config).fit  # wheel steps the format cannot write are clamped
    for _ in range(draw(st.integers(1, 4))):
        evs = [fit(e) for e in draw(st.lists(events, max_size=6))]
        target = vocab.encode(evs, ignore_images=draw(st.booleans()))
        if draw(st.booleans()):
            target = [vocab.ids["<EPISODE_START>"]] + target
        target = draw(corrupted(vocab, target)) if draw(st.booleans()) else target
        if alignment == "teacher_forcing":
            pred = [draw(st.integers(0, vocab.size - 1)) if draw(st.integers(0, 9)) == 0 else t for t in target]
            if draw(st.booleans()) and target:  # the HF shift: the first event loses its start
                pred, target = pred[1:], target[1:]
        else:
            pred = draw(corrupted(vocab, vocab.encode([fit(e) for e in draw(st.lists(events, max_size=6))])))
        targets.append(target)
        preds.append(pred)
    return preds, targets


def batch_tensors(preds, targets, alignment):
    """``(pred, target)`` [B, width] of `batches`' rows: targets padded with ignored labels, predictions with 0
    under teacher forcing (read at the target's positions only) and with ignored labels in generation."""
    width = max([len(t) for t in targets] + [1])
    pwidth = width if alignment == "teacher_forcing" else max([len(p) for p in preds] + [1])
    target = torch.tensor([t + [-100] * (width - len(t)) for t in targets], dtype=torch.long)
    pred = torch.tensor([p + [0 if alignment == "teacher_forcing" else -100] * (pwidth - len(p)) for p in preds])
    return pred, target


def _check_against_reference(vocab, preds, targets, alignment):
    width = max([len(t) for t in targets] + [1])
    if alignment == "teacher_forcing":
        preds = [p + [0] * (width - len(p)) for p in preds]
    target = torch.tensor([t + [-100] * (width - len(t)) for t in targets], dtype=torch.long)
    pwidth = max([len(p) for p in preds] + [1])
    pred = torch.tensor([p + [-100] * (pwidth - len(p)) for p in preds], dtype=torch.long)
    want = reference_decode(preds, targets, vocab, alignment=alignment)
    for backend in ("kernel", "torch"):  # the compiled CPU kernel and the torch ops (the GPU path)
        got = batch_rows(decode_batch(pred, target, vocab, alignment=alignment, backend=backend))
        assert got == want, backend
    return got


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_teacher_forcing_agrees_with_the_string_reference(format_vocab, data):
    preds, targets = data.draw(batches(format_vocab, "teacher_forcing"))
    _check_against_reference(format_vocab, preds, targets, "teacher_forcing")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_generation_agrees_with_the_string_reference(format_vocab, data):
    preds, targets = data.draw(batches(format_vocab, "generation"))
    _check_against_reference(format_vocab, preds, targets, "generation")


def test_ten_thousand_random_sequences_every_target_event_once(format_vocab):
    """Any ids, any length (0 and 1 included): no exception, one row per target span, same fields as the reference."""
    vocab, codec = format_vocab, EventCodec(format_vocab.config)
    rng = np.random.default_rng(0)
    signs = [vocab.ids[t] for t in vocab.config.sign_tokens if t in vocab.ids]
    structural = np.array(sorted(vocab.ids.values())[:14] + signs + [-100])
    vocab_size = vocab.size
    seqs = []
    for _ in range(10_000):
        n = int(rng.integers(0, 48))
        mix = np.where(rng.random(n) < 0.5, rng.choice(structural, n), rng.integers(0, vocab_size + 5, n))
        seqs.append(mix.tolist())
    seqs[:3] = [[], [vocab.ids["<EVENT_END>"]], [vocab.ids["<EVENT_START>"]]]
    total = 0
    for lo in range(0, len(seqs), 2500):
        chunk = seqs[lo:lo + 2500]
        preds = [list(reversed(s)) for s in chunk]
        for alignment in ("teacher_forcing", "generation"):
            rows = _check_against_reference(vocab, preds, chunk, alignment)
        spans = [(b, first) for b, s in enumerate(chunk)
                 for first, _, _ in codec.spans([vocab.token(i) for i in s])]
        assert [(r["seq"], r["target"]["start"]) for r in rows] == spans
        total += len(rows)
    assert total > 10_000  # the mix makes plenty of spans


def test_empty_inputs(vocab):
    for shape in [(0, 0), (3, 0), (0, 5), (2, 1)]:
        ids = torch.full(shape, -100, dtype=torch.long)
        batch = decode_batch(ids, ids, vocab)
        assert len(batch) == 0 and batch.target_count.tolist() == [0] * shape[0]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_metric_states_are_the_same_on_the_kernel_and_the_torch_path(format_vocab, data):
    """Every state of OWAEventMetrics (exact and sketch, both alignments, with or without logits under teacher
    forcing) after the same corrupted batches: the compiled kernel (decode and accumulation) and the torch ops."""
    from owa_metrics import OWAEventMetrics

    alignment = data.draw(st.sampled_from(["teacher_forcing", "generation"]))
    pred, target = batch_tensors(*data.draw(batches(format_vocab, alignment)), alignment)
    logits = None
    if alignment == "teacher_forcing" and data.draw(st.booleans(), label="with logits"):
        logits = torch.randn(*target.shape, format_vocab.size, generator=torch.Generator().manual_seed(len(pred)))
    for mode in ("exact", "sketch"):
        metrics = [OWAEventMetrics(vocab=format_vocab, alignment=alignment, mode=mode, backend=b)
                   for b in ("kernel", "torch")]
        for m in metrics:
            m.update(pred, target, logits=logits)
        states = [{k: getattr(m, k) for k in m._defaults} for m in metrics]
        for name, value in states[0].items():
            other = states[1][name]
            if isinstance(value, list):
                value, other = torch.cat(value) if value else value, torch.cat(other) if other else other
            # counts are exact; per-sequence means (a sum of ratios) and the direction error (torch's own atan2
            # gives a last-bit difference by the element's position in the tensor) to the last bits
            rtol = 1e-12 if name in ("keyboard_seq", "comparable_seq", "mouse_samples") else 0
            torch.testing.assert_close(torch.as_tensor(other), torch.as_tensor(value), rtol=rtol, atol=0,
                                       equal_nan=True, msg=f"{mode} {name}")


def test_the_accumulation_kernel_tests_matches_alike_by_bit_masks_and_condition_by_condition(format_vocab, monkeypatch):
    """`_accumulate` tests each match with two bit masks over V's columns (V of at most `MASK_COLUMNS` columns) or
    condition by condition: every state the same, on simulated sessions with 10 % of the ids corrupted (every
    status, both alignments, exact and sketch)."""
    from owa_metrics import OWAEventMetrics
    from owa_metrics.events import simulate_session
    from owa_metrics.functional import kernel as compiled

    vocab = format_vocab
    events = simulate_session(duration_s=40, seed=3, format=vocab.config.format)
    target = pad(vocab.encode_sequences(events, 512, ignore_images=True))
    g = torch.Generator().manual_seed(3)
    noisy = lambda x: torch.where(torch.rand(x.shape, generator=g) < 0.1,  # noqa: E731
                                  torch.randint(0, vocab.size, x.shape, generator=g), x)
    target, preds = noisy(target), noisy(target.clamp(min=0))
    for alignment, mode in ((a, m) for a in ("teacher_forcing", "generation") for m in ("exact", "sketch")):
        states = []
        for columns in (compiled.MASK_COLUMNS, 0):
            monkeypatch.setattr(compiled, "MASK_COLUMNS", columns)
            m = OWAEventMetrics(vocab=vocab, alignment=alignment, mode=mode, backend="kernel")
            m.update(preds, target)
            states.append({k: torch.cat(v) if isinstance(v, list) else v
                           for k, v in ((k, getattr(m, k)) for k in m._defaults)})
        assert states[0]["statuses"].sum() > 200 and states[0]["statuses"].count_nonzero() >= 3  # the cases are there
        for name, value in states[0].items():
            torch.testing.assert_close(states[1][name], value, rtol=0, atol=0, equal_nan=True, msg=f"{mode} {name}")
