import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from owa_metrics import Category, Event, EventDecodeError, Status
from owa_metrics.tokens.codec import split_tokens
from oracles import normalized

MOUSE_EXAMPLE = "<EVENT_START><MOUSE><1><2><3><1><0><19><0><9><6><7><4><0><0><0><EVENT_END>"
SCREEN_EXAMPLE = "<EVENT_START><SCREEN><0><2><9><fake_image_placeholder><EVENT_END>"


def test_issue_examples_decode_to_the_stated_values_and_back(codec):
    mouse = Event(kind="mouse", timestamp_ns=1_230_000_000, dx=-3, dy=64, button_flags=0, button_data=0)
    assert codec.decode(MOUSE_EXAMPLE) == mouse
    assert codec.encode(mouse) == MOUSE_EXAMPLE
    assert mouse.category == Category.MOUSE_NOP
    screen = codec.decode(SCREEN_EXAMPLE)
    assert screen == Event(kind="screen", timestamp_ns=290_000_000)
    assert codec.encode(screen) == SCREEN_EXAMPLE
    # 1.23 s -> <1><2><3>; -3 -> 3997 -> 1,19,9,7; 64 -> 0,0,6,4
    assert split_tokens(MOUSE_EXAMPLE)[2:5] == ["<1>", "<2>", "<3>"]
    assert split_tokens(MOUSE_EXAMPLE)[5:13:2] == ["<1>", "<19>", "<9>", "<7>"]
    assert split_tokens(MOUSE_EXAMPLE)[6:13:2] == ["<0>", "<0>", "<6>", "<4>"]


def test_keyboard_and_scroll_by_hand(codec):
    key = Event(kind="keyboard", timestamp_ns=15_990_000_000, vk=65, action="release")
    assert codec.encode(key) == "<EVENT_START><KEYBOARD><15><9><9><65><release><EVENT_END>"
    # flags 0x400 = <4><0><0>; button_data -240 -> -2 -> 18 of 20 -> <1><8>
    wheel = Event(kind="mouse", timestamp_ns=0, dx=0, dy=0, button_flags=0x400, button_data=-240)
    text = codec.encode(wheel)
    assert text.endswith("<4><0><0><1><8><EVENT_END>")
    assert codec.decode(text).button_data == -240
    assert wheel.category == Category.MOUSE_OP


def test_window_wraps_and_deltas_clamp(codec):
    e = Event(kind="mouse", timestamp_ns=17_000_000_000, dx=5000, dy=-5000)
    assert codec.decode(codec.encode(e)) == Event(kind="mouse", timestamp_ns=1_000_000_000, dx=1999, dy=-2000)


events = st.one_of(
    st.builds(Event, kind=st.just("keyboard"), timestamp_ns=st.integers(0, 10**12),
              vk=st.integers(0, 255), action=st.sampled_from(["press", "release"])),
    st.builds(Event, kind=st.just("mouse"), timestamp_ns=st.integers(0, 10**12),
              dx=st.integers(-3000, 3000), dy=st.integers(-3000, 3000), button_flags=st.integers(0, 0xFFF),
              button_data=st.one_of(st.just(0), st.integers(-65535, 65535))),
    st.builds(Event, kind=st.just("screen"), timestamp_ns=st.integers(0, 10**12)),
)


@settings(max_examples=400, deadline=None)
@given(events)
def test_encode_then_decode_is_identity_up_to_the_format(codec, event):
    assert codec.decode(codec.encode(event)) == normalized(event)
    assert codec.decode("".join(codec.tokens(event, expand_images=True))) == normalized(event)


@pytest.mark.parametrize("text, status", [
    ("<EVENT_START><JOYSTICK><1><2><3><EVENT_END>", Status.INVALID_FORMAT),
    ("<EVENT_START><KEYBOARD><1><2><EVENT_END>", Status.MISSING_FIELDS),
    ("<EVENT_START><KEYBOARD><1><2><3><65><EVENT_END>", Status.MISSING_FIELDS),
    ("<EVENT_START><KEYBOARD><1><2><3><65><press>", Status.TRUNCATED),
    ("<EVENT_START><KEYBOARD><1><2><3><65><press><EVENT_END><5>", Status.INVALID_FORMAT),
    ("<EVENT_START><KEYBOARD><1><12><3><65><press><EVENT_END>", Status.INVALID_FORMAT),  # 12 >= base 10
    ("<EVENT_START><KEYBOARD><1><2><3><press><65><EVENT_END>", Status.INVALID_FORMAT),
    ("<EVENT_START><MOUSE><1><2><3><1><0><19><0><9><6><7><4><0><0><EVENT_END>", Status.MISSING_FIELDS),
    ("<EVENT_START><MOUSE><1><2><3><2><0><19><0><9><6><7><4><0><0><0><EVENT_END>", Status.INVALID_FORMAT),
    ("<EVENT_START><MOUSE><1><2><3><1><0><19><0><9><6><7><4><0><0><0><1><EVENT_END>", Status.MISSING_FIELDS),
    ("<EVENT_START><SCREEN><0><2><9><EVENT_END>", Status.MISSING_FIELDS),
    ("<EVENT_START><SCREEN><0><2><9><image><image><5><EVENT_END>", Status.INVALID_FORMAT),
    ("<KEYBOARD><1><2><3><65><press><EVENT_END>", Status.INVALID_FORMAT),
    ("", Status.TRUNCATED),
])
def test_malformed_events_raise_a_typed_error(codec, text, status):
    with pytest.raises(EventDecodeError) as err:
        codec.decode(text)
    assert err.value.status == status
    assert isinstance(err.value, ValueError)


def test_sequence_decoder_reports_every_event_with_a_status(codec):
    good = "<EVENT_START><KEYBOARD><1><2><3><65><press><EVENT_END>"
    text = ("<1><2><3><65><release><EVENT_END>"  # first event lost its start (shifted target)
            + good + "<EVENT_START><MOUSE><1><EVENT_END>" + "junk" + good + "<EVENT_START><SCREEN><0>")
    decoded = list(codec.iter_decode("<EPISODE_START>" + text))
    assert [d.status for d in decoded] == [Status.INVALID_FORMAT, Status.VALID, Status.MISSING_FIELDS,
                                           Status.VALID, Status.TRUNCATED]
    shifted = list(codec.iter_decode("<KEYBOARD><1><2><3><65><release><EVENT_END>" + good))
    assert [d.status for d in shifted] == [Status.VALID, Status.VALID]
    assert shifted[0].event == Event(kind="keyboard", timestamp_ns=1_230_000_000, vk=65, action="release")
    assert (shifted[0].start, shifted[0].end, shifted[1].start) == (0, 6, 7)


token_soup = st.lists(st.sampled_from(
    ["<EVENT_START>", "<EVENT_END>", "<KEYBOARD>", "<MOUSE>", "<SCREEN>", "<press>", "<release>", "<0>", "<1>",
     "<15>", "<19>", "<255>", "<image>", "<fake_image_placeholder>", "<EPISODE_START>", "x", "<"]), max_size=60)


@settings(max_examples=300, deadline=None)
@given(token_soup)
def test_sequence_decoder_never_raises(codec, tokens):
    text = "".join(tokens)
    for d in codec.iter_decode(text):
        assert (d.event is None) == (d.status != Status.VALID)


def test_codec_yaml_preset_is_the_default(codec):
    import yaml

    from owa_metrics import CodecConfig

    path = __import__("pathlib").Path(__file__).resolve().parents[1] / "configs" / "codec.yaml"
    assert CodecConfig.from_dict(yaml.safe_load(path.read_text())) == codec.config
    factorized = path.with_name("codec_factorized.yaml")
    assert CodecConfig.from_dict(yaml.safe_load(factorized.read_text())) == CodecConfig.preset("factorized")
    with pytest.raises(ValueError, match="unknown CodecConfig keys"):
        CodecConfig.from_dict({"timestamp_base": [10]})
