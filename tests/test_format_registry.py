"""Issue 23, item 4: a token format is registered in one place (`register_format`: its table builder and preset);
the codec, the batch decoder (both backends), the metrics, `detect_format`, `guess_format` and the CLI all read the
registry, and a table the batch decoder cannot read is refused when built. The toy format's expected tokens and
values are written out by hand."""

import dataclasses
import json
import math

import pytest
import torch

from owa_metrics import Category, Event, EventCodec, OWAEventMetrics, Status, VocabMap, build_tokenizer, decode_batch
from owa_metrics.cli import main
from owa_metrics.decode import kernel
from owa_metrics.offline.evaluate import guess_format, read_file
from owa_metrics.tokens import FORMATS, CodecConfig, Layout, Role, Slot, TokenFormat, detect_format, register_format
from owa_metrics.tokens.format import CLAMP, REFUSE, WRAP


def toy(c: CodecConfig) -> TokenFormat:
    """A third format: digits ``<D0>``..``<D63>``, signs ``<+>`` / ``<->``; the timestamp over ``c.timestamp_bases``,
    a key's vk as 2 hex digits, dx and dy a sign then 2 digits base 64 (|d| < 4096), 3 hex digits of button flags,
    a wheel as a sign and 1 digit."""
    def number(name, bases, sign=False):
        head = [Slot(Role.SIGN, 2, name, sign=True)] if sign else []
        return head + [Slot(Role.DIGIT, b, name, math.prod(bases[i + 1:])) for i, b in enumerate(bases)]

    tokens = {c.event_start: (Role.START, 0), c.event_end: (Role.END, 0), c.keyboard_token: (Role.KEYBOARD, 0),
              c.mouse_token: (Role.MOUSE, 0), c.screen_token: (Role.SCREEN, 0), c.press_token: (Role.ACTION, 0),
              c.release_token: (Role.ACTION, 1), **{t: (Role.SIGN, i) for i, t in enumerate(c.sign_tokens)},
              **{c.digit_format.format(i): (Role.DIGIT, i) for i in range(c.num_digit_tokens)}}
    ts = number("timestamp", c.timestamp_bases)
    mouse = (*ts, *number("dx", (64, 64), sign=True), *number("dy", (64, 64), sign=True),
             *number("button_flags", (16, 16, 16)))
    layouts = (Layout("keyboard", (*ts, *number("vk", (16, 16)), Slot(Role.ACTION, 2, "action", 1))),
               Layout("mouse", mouse),
               Layout("mouse", (*mouse, *number("scroll", (10,), sign=True)), extends=1),
               Layout("screen", (*ts, Slot(Role.IMAGE))))
    return TokenFormat(c.format, tokens, layouts, {}, {"timestamp": WRAP, "dx": CLAMP, "dy": CLAMP, "scroll": REFUSE,
                                                       "vk": REFUSE, "button_flags": REFUSE},
                       c.timestamp_unit_ns, c.scroll_unit)


TOY = {"digit_format": "<D{}>", "num_digit_tokens": 64, "sign_tokens": ("<+>", "<->"), "timestamp_bases": (25, 64)}


@pytest.fixture
def registered():
    """The toy format registered for one test, then taken out of the registry."""
    register_format("toy", toy, **TOY)
    yield CodecConfig.preset("toy")
    del FORMATS["toy"]


KEY = Event(kind="keyboard", timestamp_ns=1_230_000_000, vk=65, action="press")
MOVE = Event(kind="mouse", timestamp_ns=1_500_000_000, dx=-3, dy=200)
CLICK = Event(kind="mouse", timestamp_ns=1_600_000_000, dx=0, dy=0, button_flags=0x001)
WHEEL = Event(kind="mouse", timestamp_ns=1_700_000_000, dx=5, dy=0, button_flags=0x800, button_data=-240)
SCREEN = Event(kind="screen", timestamp_ns=15_000_000_000)
EVENTS = [KEY, MOVE, CLICK, WHEEL, SCREEN]
# by hand: 123 units of 10 ms = 1 x 64 + 59, vk 65 = 0x41, 200 = 3 x 64 + 8, a wheel of -240 = -2 steps of 120
TEXTS = ["<EVENT_START><KEYBOARD><D1><D59><D4><D1><press><EVENT_END>",
         "<EVENT_START><MOUSE><D2><D22><-><D0><D3><+><D3><D8><D0><D0><D0><EVENT_END>",
         "<EVENT_START><MOUSE><D2><D32><+><D0><D0><+><D0><D0><D0><D0><D1><EVENT_END>",
         "<EVENT_START><MOUSE><D2><D42><+><D0><D5><+><D0><D0><D8><D0><D0><-><D2><EVENT_END>",
         "<EVENT_START><SCREEN><D23><D28><fake_image_placeholder><EVENT_END>"]


def test_the_toy_format_encodes_and_decodes_in_the_string_codec(registered):
    codec = EventCodec(registered)
    assert [codec.encode(e) for e in EVENTS] == TEXTS
    assert [codec.decode(text) for text in TEXTS] == EVENTS
    assert registered.timestamp_window_ns == 16_000_000_000


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_the_toy_format_decodes_in_a_batch(registered, backend):
    if backend == "kernel" and not kernel.available():
        pytest.skip("numba is not available")
    vocab = VocabMap.from_tokenizer(build_tokenizer(format="toy"))
    assert vocab.config == registered
    target = torch.tensor([vocab.encode(EVENTS)])
    batch = decode_batch(target.clone(), target, vocab, backend=backend)
    assert batch.status.tolist() == [Status.VALID] * 5
    for side in (batch.target, batch.pred):
        assert side.category.tolist() == [Category.KEYBOARD, Category.MOUSE_NOP, Category.MOUSE_OP, Category.MOUSE_OP,
                                          Category.SCREEN]
        assert side.timestamp_ns.tolist() == [1_230_000_000, 1_500_000_000, 1_600_000_000, 1_700_000_000,
                                              15_000_000_000]
        assert side.vk.tolist() == [65, 0, 0, 0, 0] and side.action.tolist() == [0, 0, 0, 0, 0]
        assert side.dx.tolist() == [0, -3, 0, 5, 0] and side.dy.tolist() == [0, 200, 0, 0, 0]
        assert side.button_flags.tolist() == [0, 0, 0x001, 0x800, 0]
        assert side.button_data.tolist() == [0, 0, 0, -240, 0]
        # digit levels from the toy's table: 2 timestamp digits, dx / dy a sign then 2 digits
        assert side.timestamp_digits.tolist() == [[1, 59], [2, 22], [2, 32], [2, 42], [23, 28]]
        assert side.dx_digits.tolist()[1:4] == [[1, 0, 3], [0, 0, 0], [0, 0, 5]]
        assert side.dy_digits.tolist()[1] == [0, 3, 8]
    # a sign where the key's first vk digit belongs: that prediction does not decode
    broken = target.clone()
    broken[0, 4] = vocab.ids["<+>"]
    assert decode_batch(broken, target, vocab, backend=backend).status.tolist() == [Status.INVALID_FORMAT] + [0] * 4


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_the_toy_format_reports_the_metrics(registered, backend):
    if backend == "kernel" and not kernel.available():
        pytest.skip("numba is not available")
    tokenizer = build_tokenizer(format="toy")
    metric = OWAEventMetrics(tokenizer, alignment="generation", backend=backend, generated_screens="scored")
    assert metric.vocab.config.format == "toy"
    # the key's vk 66 for 65, the screen 20 ms late (1502 units: the first digit right, the second wrong)
    preds = [dataclasses.replace(KEY, vk=66), MOVE, CLICK, WHEEL, dataclasses.replace(SCREEN, timestamp_ns=15_020_000_000)]
    metric.update(torch.tensor([metric.vocab.encode(preds)]), torch.tensor([metric.vocab.encode(EVENTS)]))
    report = {k: float(v) for k, v in metric.compute().items()}
    expected = {"count/target_events": 5, "status/valid": 5, "keyboard/count": 1, "mouse_op/count": 2,
                "mouse_nop/count": 1, "screen/count": 1, "keyboard/vk_accuracy": 0, "keyboard/action_accuracy": 1,
                "keyboard/accuracy": 0, "screen/timestamp/abs_error_p95_ms": 20, "screen/timestamp/precision_p1": 1,
                "screen/timestamp/precision_p2": 0, "mouse/dx_precision_p3": 1, "mouse/euclidean_pe_p95_pct": 0}
    assert {k: report[k] for k in expected} == pytest.approx(expected, abs=1e-9)
    assert "timestamp/precision_p3" not in report and "mouse/dx_precision_p4" not in report


def test_the_toy_format_is_detected_guessed_and_a_cli_choice(registered, tmp_path, capsys):
    assert detect_format(build_tokenizer(format="toy").get_vocab()) == "toy"
    assert detect_format(build_tokenizer().get_vocab()) == "hierarchical"  # the others are still told apart
    (tmp_path / "true.txt").write_text("".join(TEXTS) + "\n")
    pred = TEXTS[:4] + ["<EVENT_START><SCREEN><D23><D30><fake_image_placeholder><EVENT_END>"]  # 20 ms late
    (tmp_path / "pred.txt").write_text("".join(pred) + "\n")
    assert guess_format(read_file(tmp_path / "true.txt")) == "toy"
    assert guess_format(["<EVENT_START><KEYBOARD><0><0><0><6><press><EVENT_END>"]) == "hierarchical"
    assert guess_format(["<EVENT_START><SCREEN><0><5><0><fake_image_placeholder><EVENT_END>"]) is None
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "--format {hierarchical,factorized,toy}" in capsys.readouterr().out
    # the command guesses the toy format from the files and reads them in it
    assert main(["evaluate", "--pred", str(tmp_path / "pred.txt"), "--target", str(tmp_path / "true.txt"), "--json",
                 str(tmp_path / "r.json"), "--strict", "--generated-screens", "scored"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status/valid"] == 5 and report["screen/timestamp/abs_error_p95_ms"] == 20
    assert report["keyboard/accuracy"] == 1


def test_the_registry_takes_one_format_per_name_and_the_fixture_leaves_none():
    assert list(FORMATS) == ["hierarchical", "factorized"]
    with pytest.raises(ValueError, match="'factorized' is registered already"):
        register_format("factorized", toy, **TOY)
    with pytest.raises(ValueError, match="unknown format 'toy': choose one of"):
        CodecConfig.preset("toy")


def _table(**changes):
    """A builder of the toy's table with ``changes`` (a function of the table -> its fields)."""
    def build(c):
        table = toy(c)
        return dataclasses.replace(table, **{k: f(table) for k, f in changes.items()})
    return build


LIMITS = [  # (builder, preset changes, the words of the refusal)
    (toy, {"timestamp_bases": (2, 3, 5, 7, 11)}, "10 distinct slot rules"),
    (toy, {"timestamp_bases": (40_000,)}, "bound 40000"),
    (_table(tokens=lambda t: {**t.tokens, "<D_huge>": (Role.DIGIT, 1 << 23)}), {}, "'<D_huge>' has value 8388608"),
    (_table(layouts=lambda t: t.layouts[:3]), {}, "no screen layout"),
    (_table(layouts=lambda t: (Layout("keyboard", t.layouts[0].slots[:2]), *t.layouts[1:])), {}, "'keyboard' layout"),
    (_table(layouts=lambda t: (*t.layouts, dataclasses.replace(t.layouts[2], slots=t.layouts[2].slots[:-1]))), {},
     "more than one layout extends"),
    (_table(layouts=lambda t: (*t.layouts[:3], Layout("screen", (Slot(Role.IMAGE), *t.layouts[3].slots[:-1])))), {},
     "slots after its image run"),
    (_table(modulus=lambda t: {"button_flags": 4096}), {}, "button_flags is read as an unsigned field"),
    (_table(timestamp_unit_ns=lambda t: 10 ** 13), {}, "not below 2\\^53"),
    (_table(layouts=lambda t: (t.layouts[0], *(dataclasses.replace(lay, slots=lay.slots[:4] + lay.slots[5:])
                                                for lay in t.layouts[1:3]), t.layouts[3])), {},
     "dx in 2 tokens, dy in 3"),
]


@pytest.mark.parametrize("build, preset, words", LIMITS)
def test_a_table_beyond_the_decoders_limits_is_refused_when_registered(build, preset, words):
    with pytest.raises(ValueError, match=f"the wide format's table exceeds the batch decoder's limits: .*{words}"):
        register_format("wide", build, **{**TOY, **preset})
    assert "wide" not in FORMATS
