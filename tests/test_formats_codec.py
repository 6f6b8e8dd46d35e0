"""The factorized token format against an independent oracle written from its specification."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from owa_metrics import CodecConfig, Event, EventCodec, EventDecodeError, EventEncodeError, Status
from factorized_oracle import (FACTORIZED_VOCAB, IMAGE_PLACEHOLDER, encode_factorized, normalized_factorized,
                               signed16)


@pytest.fixture(scope="module")
def fcodec():
    return EventCodec(CodecConfig.preset("factorized"))


def tokens_of(text):
    toks = re.findall(r"<[^<>]*>", text)
    assert "".join(toks) == text
    return toks


# ------------------------------------------------------------------ upstream's worked examples
WORKED = [
    ("<EVENT_START><MOUSE><3><1><8><SIGN_MINUS><0><0><3><7><SIGN_PLUS><0><0><3><4><MB_0><MB_0><MB_0><EVENT_END>",
     Event(kind="mouse", timestamp_ns=3_180_000_000, dx=-37, dy=34, button_flags=0, button_data=0)),
    ("<EVENT_START><MOUSE><3><7><6><SIGN_PLUS><0><0><0><0><SIGN_PLUS><0><0><0><0><MB_0><MB_0><MB_1><EVENT_END>",
     Event(kind="mouse", timestamp_ns=3_760_000_000, dx=0, dy=0, button_flags=0x001, button_data=0)),
    ("<EVENT_START><MOUSE><6><9><5><SIGN_MINUS><0><3><0><0><SIGN_PLUS><0><2><5><0><MB_4><MB_0><MB_2>"
     "<SIGN_MINUS><3><EVENT_END>",
     Event(kind="mouse", timestamp_ns=6_950_000_000, dx=-300, dy=250, button_flags=0x402, button_data=-360)),
    ("<EVENT_START><KEYBOARD><0><0><5><VK_65><press><EVENT_END>",
     Event(kind="keyboard", timestamp_ns=50_000_000, vk=65, action="press")),
]


@pytest.mark.parametrize("text, event", WORKED)
def test_worked_examples_decode_and_encode_back(fcodec, text, event):
    assert fcodec.decode(text) == event
    assert fcodec.encode(event) == text
    assert encode_factorized(event) == text
    assert len(tokens_of(text)) == {"keyboard": 8, "mouse": 19 if not event.button_data else 21}[event.kind]


def test_wheel_example_from_the_unsigned_button_data(fcodec):
    # the recording holds button_data as an unsigned 16-bit word: 65176 == -360 & 0xFFFF
    text, decoded = WORKED[2]
    unsigned = Event(kind="mouse", timestamp_ns=6_950_000_000, dx=-300, dy=250, button_flags=0x402,
                     button_data=65176)
    assert signed16(65176) == -360
    assert encode_factorized(unsigned) == text
    assert fcodec.encode(unsigned) == text
    assert fcodec.decode(fcodec.encode(unsigned)) == decoded
    assert fcodec.decode(text).button_data == -360


def test_screen_and_window_by_hand(fcodec):
    screen = Event(kind="screen", timestamp_ns=290_000_000)
    text = "<EVENT_START><SCREEN><0><2><9><fake_image_placeholder><EVENT_END>"
    assert encode_factorized(screen) == text
    assert fcodec.encode(screen) == text
    assert fcodec.decode(text) == screen
    # 10 s window: 10 s -> <0><0><0>; 12.345 s -> 1234 units -> 234
    assert fcodec.encode(Event(kind="screen", timestamp_ns=10_000_000_000)).startswith(
        "<EVENT_START><SCREEN><0><0><0>")
    late = Event(kind="keyboard", timestamp_ns=12_345_000_000, vk=255, action="release")
    assert fcodec.encode(late) == "<EVENT_START><KEYBOARD><2><3><4><VK_255><release><EVENT_END>"
    assert fcodec.decode(fcodec.encode(late)) == Event(kind="keyboard", timestamp_ns=2_340_000_000, vk=255,
                                                       action="release")


def test_clamping_by_hand(fcodec):
    e = Event(kind="mouse", timestamp_ns=0, dx=5000, dy=-2000, button_flags=0xFFF)
    text = ("<EVENT_START><MOUSE><0><0><0><SIGN_PLUS><1><9><9><9><SIGN_MINUS><1><9><9><9>"
            "<MB_15><MB_15><MB_15><EVENT_END>")
    assert encode_factorized(e) == text
    assert fcodec.encode(e) == text
    assert fcodec.decode(text) == Event(kind="mouse", timestamp_ns=0, dx=1999, dy=-1999, button_flags=0xFFF,
                                        button_data=0)


# ------------------------------------------------------------------ round trip against the oracle
timestamps = st.one_of(st.integers(0, 10**12),
                       st.sampled_from([0, 9_999_999, 10_000_000, 9_990_000_000, 9_999_999_999, 10_000_000_000]))
deltas = st.one_of(st.integers(-5000, 5000), st.sampled_from([-2000, -1999, -1000, -1, 0, 1, 999, 1999, 2000]))


@st.composite
def button_datas(draw):
    if draw(st.booleans()):
        return 0
    value = draw(st.integers(-9, 9)) * 120 + draw(st.integers(0, 119))  # floor-divides back to s
    return value & 0xFFFF if draw(st.booleans()) else value  # signed or as the unsigned 16-bit word


events = st.one_of(
    st.builds(Event, kind=st.just("keyboard"), timestamp_ns=timestamps,
              vk=st.integers(0, 255), action=st.sampled_from(["press", "release"])),
    st.builds(Event, kind=st.just("mouse"), timestamp_ns=timestamps, dx=deltas, dy=deltas,
              button_flags=st.integers(0, 0xFFF), button_data=button_datas()),
    st.builds(Event, kind=st.just("screen"), timestamp_ns=timestamps),
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_encode_matches_the_oracle_and_round_trips(fcodec, event):
    want = encode_factorized(event)
    toks = tokens_of(want)
    assert all(t in FACTORIZED_VOCAB or t == IMAGE_PLACEHOLDER for t in toks)
    if event.kind == "mouse":
        assert len(toks) == (21 if event.button_data else 19)
    assert fcodec.encode(event) == want
    assert fcodec.decode(want) == normalized_factorized(event)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("event", [
    Event(kind="keyboard", timestamp_ns=0, vk=256, action="press"),
    Event(kind="mouse", timestamp_ns=0, dx=0, dy=0, button_flags=0x800, button_data=1200),
    Event(kind="mouse", timestamp_ns=0, dx=0, dy=0, button_flags=0x800, button_data=-1200 & 0xFFFF),
], ids=["vk256", "scroll+10", "scroll-10"])
def test_unrepresentable_events_are_refused(fcodec, event):
    assert issubclass(EventEncodeError, ValueError)
    with pytest.raises(ValueError):
        encode_factorized(event)
    with pytest.raises(EventEncodeError):
        fcodec.encode(event)


def test_largest_scrolls_are_accepted(fcodec):
    for bd, s in [(1199, 9), (-1080 & 0xFFFF, -9), (-1080, -9)]:
        e = Event(kind="mouse", timestamp_ns=0, dx=0, dy=0, button_flags=0x800, button_data=bd)
        text = fcodec.encode(e)
        assert text == encode_factorized(e)
        assert text.endswith(("<SIGN_PLUS>" if s > 0 else "<SIGN_MINUS>") + f"<{abs(s)}><EVENT_END>")
        assert fcodec.decode(text).button_data == s * 120


# ------------------------------------------------------------------ vocabulary and presets
def test_vocabulary_is_the_spec_vocabulary():
    config = CodecConfig.preset("factorized")
    assert config.format == "factorized"
    assert len(config.event_tokens) == 291
    assert set(config.event_tokens) == set(FACTORIZED_VOCAB)


def test_hierarchical_preset_is_the_default():
    assert CodecConfig.preset("hierarchical") == CodecConfig()
    assert CodecConfig.preset("hierarchical").format == "hierarchical"


# ------------------------------------------------------------------ malformed input
MOUSE_TEXT = WORKED[0][0]
KEY_TEXT = WORKED[3][0]


@pytest.mark.parametrize("text, status", [
    # <65> is no factorized token at all
    (KEY_TEXT.replace("<VK_65>", "<65>"), Status.INVALID_FORMAT),
    # a digit where dx's sign belongs (same token count)
    (MOUSE_TEXT.replace("<SIGN_MINUS>", "<1>"), Status.INVALID_FORMAT),
    # <EVENT_END> right after a mouse event's timestamp
    ("<EVENT_START><MOUSE><3><1><8><EVENT_END>", Status.MISSING_FIELDS),
    # the text ends where <EVENT_END> belongs
    (MOUSE_TEXT[: -len("<EVENT_END>")], Status.TRUNCATED),
    # <15> is a hierarchical timestamp digit, not a factorized one
    (KEY_TEXT.replace("<0><0><5>", "<0><15><5>"), Status.INVALID_FORMAT),
], ids=["bare-vk", "digit-for-sign", "end-after-timestamp", "cut-before-end", "hierarchical-digit"])
def test_malformed_text_raises_a_typed_error(fcodec, text, status):
    with pytest.raises(EventDecodeError) as err:
        fcodec.decode(text)
    assert err.value.status == status
