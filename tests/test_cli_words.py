"""Issue 24's CLI points: --strict on every warning, warnings in the command's words, help for every flag and the
input format, a --help that imports no torch, inspect's one-time decode timed apart. Expected values are written
out by hand (token strings, event counts)."""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from owa_metrics import CodecConfig, Event, EventCodec
from owa_metrics.cli import build_parser, main
from conftest import recording_paths

ROOT = Path(__file__).resolve().parents[1]
# hierarchical key A (vk 65) pressed at 0.S0 s: three time digits (tens of ms), vk, action
KEY = "<EVENT_START><KEYBOARD><0><{}><0><65><press><EVENT_END>"
BROKEN = "<EVENT_START><KEYBOARD><0><0><0><65><EVENT_END>"  # no action token: does not decode
PYTHON_WORDS = ("format=", ".py:", "UserWarning", "CodecConfig", "image_token", "<image>", "<global-img>",
                "<fake_token_around_image>")


def warning_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]


def evaluate(tmp_path, keys: list[str], *flags: str) -> int:
    """``owa-metrics evaluate`` of a one-line file holding ``keys`` against itself."""
    path = tmp_path / "true.txt"
    path.write_text("".join(keys) + "\n")
    return main(["evaluate", "--pred", str(path), "--target", str(path), *flags])


def test_strict_exits_1_when_more_than_5_percent_of_the_true_events_do_not_decode(tmp_path, capsys):
    keys = [KEY.format(s) for s in range(10)]
    assert evaluate(tmp_path, keys, "--strict") == 0 and warning_lines(capsys) == []
    # 1 of 10 (10 %): warns, --strict exits 1; the warning without --strict exits 0
    assert evaluate(tmp_path, keys[:9] + [BROKEN], "--strict") == 1
    [line] = warning_lines(capsys)
    assert line == (f"owa-metrics evaluate: warning: {tmp_path / 'true.txt'}: 1 of 10 true events (10%) do not decode "
                    "in the hierarchical format (most often: missing_fields) and are left out of every rate")
    assert evaluate(tmp_path, keys[:9] + [BROKEN]) == 0 and len(warning_lines(capsys)) == 1
    # 1 of 20 (5 %) is not more than 5 %
    assert evaluate(tmp_path, keys + keys[:9] + [BROKEN], "--strict") == 0 and warning_lines(capsys) == []


def test_the_other_format_is_named_as_a_flag(tmp_path, capsys):
    # hierarchical files read as factorized: <65> is no factorized token, so no event decodes
    assert evaluate(tmp_path, [KEY.format(1), KEY.format(2), KEY.format(3)], "--format", "factorized",
                    "--strict") == 1
    [line] = warning_lines(capsys)
    assert line.startswith("owa-metrics evaluate: warning: ")
    assert line.endswith("true.txt: 3 of 3 true events (100%) do not decode in the factorized format (most often: "
                         "invalid_format) and are left out of every rate; if the files are in the hierarchical "
                         "format, pass --format hierarchical")
    assert not [word for word in PYTHON_WORDS if word in line]


def test_the_format_guess_is_in_cli_words(tmp_path, capsys):
    screen = "<EVENT_START><SCREEN><0><5><0><fake_image_placeholder><EVENT_END>"  # both formats write it alike
    assert evaluate(tmp_path, [screen], "--strict", "--generated-screens", "scored") == 1
    [line] = warning_lines(capsys)
    assert "true.txt: its tokens do not tell the token format" in line and "pass --format" in line
    assert not [word for word in PYTHON_WORDS if word in line]


def test_every_option_of_every_command_has_help():
    def walk(parser: argparse.ArgumentParser, name: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    yield f"{name} {choice.dest}", choice.help
                for command, sub in action.choices.items():
                    yield from walk(sub, f"{name} {command}")
            else:
                yield f"{name} {'/'.join(action.option_strings) or action.dest}", action.help

    helps = dict(walk(build_parser(), "owa-metrics"))
    assert {"owa-metrics evaluate --mode", "owa-metrics demo --epochs", "owa-metrics inspect --max-tokens",
            "owa-metrics inspect paths", "owa-metrics demo"} <= set(helps)
    assert len(helps) == 33, sorted(helps)  # 2 + 3 commands + inspect 4, demo 7, evaluate 17 (each with -h)
    assert not [name for name, text in helps.items() if not text or text == argparse.SUPPRESS]


def test_the_demo_help_says_the_demo_defaults():
    """``demo --help`` names each default it mentions as DemoConfig (and configs/demo.yaml) has it."""
    import re

    import yaml

    from owa_metrics.demo import DemoConfig

    demo = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["demo"]
    shipped = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "demo.yaml").read_text())
    said = {a.dest: re.search(r"default: the config's, ([^)]+)\)", a.help) for a in demo._actions if a.help}
    said = {name: match.group(1) for name, match in said.items() if match}
    assert set(said) == {"epochs", "logger", "out", "format"}
    for name, text in said.items():
        assert text == str(getattr(DemoConfig(), name)) == str(shipped[name]), name


def test_evaluate_help_describes_the_input_files_with_examples(capsys):
    try:
        main(["evaluate", "--help"])
    except SystemExit as stop:
        assert stop.code == 0
    text = capsys.readouterr().out
    assert ".mcap" in text and ".jsonl" in text and '"text"' in text and "one sequence a line" in text
    assert "owa-metrics evaluate --pred pred.txt --target true.txt" in text
    # the example: key A (vk 65) pressed at 1.00 s, a screen at 1.50 s, written out here by hand
    assert ("<EVENT_START><KEYBOARD><1><0><0><65><press><EVENT_END>"
            "<EVENT_START><SCREEN><1><5><0><fake_image_placeholder><EVENT_END>") in text
    assert '{"text": "<EVENT_START><KEYBOARD><1><0><0><65><press><EVENT_END>"}' in text
    # and the codec writes them so; factorized writes <VK_65> for <65>
    key_a = Event(kind="keyboard", timestamp_ns=1_000_000_000, vk=65, action="press")
    assert EventCodec().encode(key_a) == "<EVENT_START><KEYBOARD><1><0><0><65><press><EVENT_END>"
    assert EventCodec().encode(Event(kind="screen", timestamp_ns=1_500_000_000)) == \
        "<EVENT_START><SCREEN><1><5><0><fake_image_placeholder><EVENT_END>"
    assert EventCodec(CodecConfig.preset("factorized")).encode(key_a) == \
        "<EVENT_START><KEYBOARD><1><0><0><VK_65><press><EVENT_END>"


def test_help_imports_nothing_heavy():
    code = """
        import sys
        from owa_metrics.cli import main
        for argv in (["--help"], ["evaluate", "--help"], ["inspect", "--help"], ["demo", "--help"], ["--version"]):
            try:
                main(argv)
            except SystemExit:
                pass
        heavy = ("torch", "lightning", "transformers", "numba", "torchmetrics", "numpy")
        print(sorted(name for name in heavy if name in sys.modules))
    """
    out = subprocess.run([sys.executable, "-c", "\n".join(line[8:] for line in code.splitlines())],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def test_inspect_times_the_first_decode_apart(capsys):
    [path] = [path for path in recording_paths() if path.name == "0.5.1.mcap"]
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:7] == ["0.5.1.mcap", "255", "20", "2", "216", "17", "3968"]
    assert out[1].split()[7:9] == ["255/255", "255/255"]
    assert re.fullmatch(r"first decode: \d+\.\d ms, once per process \((numba compiles its kernels or loads them "
                        r"from its cache|the torch path)\); decode_ms leaves it out", out[2]), out[2]
    assert len(out) == 3

