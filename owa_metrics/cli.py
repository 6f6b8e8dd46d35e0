"""The ``owa-metrics`` command."""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from pathlib import Path
from typing import Optional

KEY_A = "<EVENT_START><KEYBOARD><1><0><0><65><press><EVENT_END>"  # hierarchical: key A (vk 65) pressed at 1.00 s
SCREEN = "<EVENT_START><SCREEN><1><5><0><fake_image_placeholder><EVENT_END>"  # a screen frame at 1.50 s
EVALUATE_INPUT = f"""\
input files (--pred, --target): the k-th predicted sequence is compared with the k-th true one
  NAME.mcap   an OWA recording: all its events make one sequence
  NAME.jsonl  one sequence a line: a JSON string, or an object with a "text" field (and a "tag": the report
              adds each tag's keys and a table, a row per tag)
  any other   UTF-8 text, one sequence a line (a blank line is an empty sequence)
A sequence is event tokens as the model writes them; text between events is ignored. E.g. key A pressed at
1.00 s, then a screen at 1.50 s (hierarchical format; factorized writes <VK_65> for <65>):
  {KEY_A}{SCREEN}

examples:
  owa-metrics evaluate --pred pred.txt --target true.txt
  owa-metrics evaluate --pred pred.jsonl --target recording.mcap --json report.json
  owa-metrics evaluate --pred pred.txt --target true.txt --format factorized --strict
  owa-metrics evaluate --pred pred.txt --target true.txt --pairing time --tolerance-ms 100
  owa-metrics evaluate --pred pred.mcap --target true.mcap --bin-ms 50 --bin-shifts -3 3   (the D2E protocol)
  owa-metrics evaluate --pred preds/ --target truths/ --bin-ms 50   (folders: .mcap files paired by name)
  owa-metrics evaluate --pred pred.jsonl --target true.jsonl --html report.html   (tables and timelines, one file)
  torchrun --nproc-per-node 8 -m owa_metrics evaluate --pred preds/ --target truths/ --bin-ms 50   (8 processes)

pred.jsonl, one line per sequence (true.jsonl may tag it: {{"text": ..., "tag": "minecraft"}}):
  {{"text": "{KEY_A}"}}
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``owa-metrics`` argument parser (imports nothing heavy: ``--help`` answers at once)."""
    from . import __version__
    from .tokens.codec import FORMATS  # the registered formats (no torch)

    parser = argparse.ArgumentParser(prog="owa-metrics", description="Event metrics for OWA desktop agents.",
                                     epilog="owa-metrics COMMAND --help: that command's options")
    parser.add_argument("--version", action="version", version=f"owa-metrics {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="decode OWA recordings (MCAP) through the token format and report",
                                  description="Each recording -> events -> tokens -> the batch decoder: what came "
                                              "back, and how fast.")
    inspect.add_argument("paths", nargs="+", type=Path, help="OWA .mcap recordings")
    inspect.add_argument("--max-tokens", type=int, default=2048,
                         help="tokens per sequence: the events are packed whole into sequences of at most this "
                              "many tokens (default 2048)")
    inspect.add_argument("--format", choices=list(FORMATS), default="hierarchical",
                         help="the token format (default hierarchical)")
    demo = commands.add_parser("demo", help="train a tiny causal LM on event tokens and log the event metrics")
    demo.add_argument("--config", help="YAML settings, as in configs/demo.yaml; the flags below override them")
    demo.add_argument("--epochs", type=int, help="epochs to train (default: the config's, 3)")
    demo.add_argument("--logger", choices=["tensorboard", "csv", "wandb"],
                      help="where the metrics go (default: the config's, tensorboard)")
    demo.add_argument("--mcap", nargs="+", type=Path, help="real OWA recordings instead of the simulator")
    demo.add_argument("--out", help="log directory (default: the config's, runs/demo)")
    demo.add_argument("--format", choices=list(FORMATS), help="the token format (default: the config's, hierarchical)")
    evaluate = commands.add_parser("evaluate", help="compare predicted with true event sequences from files",
                                   description="Compare predicted with true event sequences from files; prints the "
                                               "report the Lightning callback writes.",
                                   epilog=EVALUATE_INPUT, formatter_class=argparse.RawDescriptionHelpFormatter)
    evaluate.add_argument("--pred", required=True, type=Path, help="the predicted sequences (see input files)")
    evaluate.add_argument("--target", required=True, type=Path, help="the true sequences, as many as --pred's")
    evaluate.add_argument("--mode", choices=["exact", "sketch"], default="exact",
                          help="exact: quantiles of every sample; sketch: of a fixed-size histogram within 0.5 %% "
                               "(default exact)")
    evaluate.add_argument("--json", type=Path, help="also write every metric to this JSON file")
    evaluate.add_argument("--html", type=Path, help="also write one self-contained HTML page: the tables, the D2E "
                                                    "latency curve, the confusion and the timelines of sequences")
    evaluate.add_argument("--html-sequences", type=int, default=4, metavar="N",
                          help="--html draws the timelines of the N sequences (D2E: files) with the most errors and "
                               "of the first N (default 4)")
    evaluate.add_argument("--format", choices=list(FORMATS), help="the token format (default: the target file's)")
    evaluate.add_argument("--pairing", choices=["index", "time"], default="index",
                          help="pair the k-th events (index) or match events within --tolerance-ms (time) "
                               "(default index)")
    evaluate.add_argument("--tolerance-ms", type=float, nargs="+",
                          help="time pairing's tolerance in ms (default 100; needs --pairing time); several: "
                               "detection at each (detect/f1_within_{t}ms, ..., detect/f1_mean), the first pairs")
    evaluate.add_argument("--generated-screens", choices=["context", "scored"], default="context",
                          help="context: screens are what the model is shown, left out of the pairing and every "
                               "key (the predictions are scored on their actions); scored: screens are paired and "
                               "scored like actions, for a model that predicts screen timing (default context)")
    evaluate.add_argument("--image-tokens", metavar="VLM|TOKENS",
                          help="the model's image tokens in screen events: a VLM's name (InternVL, SmolVLM, "
                               "Qwen2-VL, Qwen2.5-VL) or 'PREFIX... IMAGE x COUNT SUFFIX...', e.g. "
                               "'<img> <IMG_CONTEXT> x 256 </img>' (default: SmolVLM's, or <fake_image_placeholder>)")
    evaluate.add_argument("--no-progress", action="store_true",
                          help="no progress bar (files read, MB/s) on stderr; there is none when stderr is not a "
                               "terminal, nor on torchrun's ranks but 0")
    evaluate.add_argument("--strict", action="store_true",
                          help="exit 1 when there is any warning (e.g. more than 5 %% of the true events do not "
                               "decode)")
    d2e = evaluate.add_argument_group("the D2E protocol (the D2E paper's binned metrics; MCAP pairs, see "
                                      "docs/METRICS.md)")
    d2e.add_argument("--bin-ms", type=float, help="compare the two MCAP recordings over bins of this many ms "
                                                  "(upstream's 50): prints the d2e/... keys only")
    d2e.add_argument("--empty-bins-as-correct", action="store_true",
                     help="a bin with no button (key) on either side counts as one right value")
    d2e.add_argument("--bin-shifts", type=int, nargs=2, metavar=("LOW", "HIGH"),
                     help="also score the prediction moved by k bins for k = LOW..HIGH (..._shift_{k}bins keys) and "
                          "report d2e/best_shift_bins")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "inspect":
        return _inspect(args.paths, args.max_tokens, args.format)
    if args.command == "demo":
        from .demo import main as demo_main
        from .offline.evaluate import InputError

        try:
            return demo_main(args.config, args.epochs, args.logger, args.mcap, args.out, args.format)
        except InputError as err:
            print(f"owa-metrics demo: {err}".splitlines()[0], file=sys.stderr)
            return 2
    if args.command == "evaluate":
        clash = output_is_input({"--json": args.json, "--html": args.html}, [args.pred, args.target])
        if clash:  # refused before anything is read: writing the report would replace an input file
            print(f"owa-metrics evaluate: {clash}", file=sys.stderr)
            return 2
        progress = False if args.no_progress else None
        with _processes():
            if args.html_sequences < 0:
                print(f"owa-metrics evaluate: --html-sequences is how many sequences' timelines to draw (>= 0), got "
                      f"{args.html_sequences}", file=sys.stderr)
                return 2
            html = (args.html, args.html_sequences) if args.html else None
            if args.bin_ms is not None or args.bin_shifts or args.empty_bins_as_correct:
                return _evaluate_d2e(args.pred, args.target, args.bin_ms, args.empty_bins_as_correct, args.bin_shifts,
                                     args.json, progress, args.strict, html)
            if args.tolerance_ms is not None and args.pairing != "time":  # it would have no effect: say so
                print("owa-metrics evaluate: --tolerance-ms is the tolerance of --pairing time: add --pairing time "
                      "to match events within it, or leave --tolerance-ms out (index pairing matches nothing by "
                      "time)", file=sys.stderr)
                return 2
            tolerance_ms = None if args.tolerance_ms is None else \
                args.tolerance_ms[0] if len(args.tolerance_ms) == 1 else tuple(args.tolerance_ms)
            return _evaluate(args.pred, args.target, args.mode, args.json, args.format, args.strict, args.pairing,
                             tolerance_ms, args.generated_screens, args.image_tokens, progress, html)
    parser.print_help()
    return 0


@contextlib.contextmanager
def _processes():
    """Under torchrun (``WORLD_SIZE`` > 1): one gloo process group for the command (each rank evaluates its share,
    the states sync; one the calling program set up is used as it is), and only rank 0 prints; alone: nothing."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield
        return
    import torch.distributed as dist

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo")
    try:
        if dist.get_rank() == 0:
            yield
        else:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                yield
    finally:
        if own:
            dist.destroy_process_group()


def _rank_zero() -> bool:
    """Whether this process writes files: alone, or rank 0 of torchrun's."""
    from .offline.streaming import rank_world

    return rank_world()[0] == 0


def _evaluate(pred: Path, target: Path, mode: str, json_path: Path | None, format: str | None, strict: bool,
              pairing: str = "index", tolerance_ms: float | tuple | None = None, generated_screens: str = "context",
              image_tokens: str | None = None, progress: bool | None = None,
              html: tuple[Path, int] | None = None) -> int:
    import json
    import warnings

    from .offline.evaluate import InputError, evaluate, evaluation_warnings

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = evaluate(pred, target, mode, format=format, pairing=pairing, tolerance_ms=tolerance_ms,
                              generated_screens=generated_screens, image_tokens=image_tokens, progress=progress)
    except (InputError, ImportError) as err:
        print(f"owa-metrics evaluate: {err}".splitlines()[0], file=sys.stderr)
        return 2
    except ValueError as err:  # e.g. the two files hold different numbers of sequences
        print(f"owa-metrics evaluate: {err}".splitlines()[0], file=sys.stderr)
        return 2
    from .report import format_report

    print(format_report(report, f"OWA event metrics: {pred.name} vs {target.name}", alignment="generation"))
    lines = [_cli_words(w.message) for w in caught] + evaluation_warnings(report, pred, target, generated_screens)
    for line in lines:
        print(f"owa-metrics evaluate: warning: {line}", file=sys.stderr)
    if json_path and _rank_zero():
        try:
            write_output(json_path, json.dumps(report, indent=1) + "\n")
        except OSError as err:
            print(f"owa-metrics evaluate: {json_path}: cannot write the JSON report ({err.strerror or err})",
                  file=sys.stderr)
            return 2
        print(f"wrote {json_path}")
    if html and _rank_zero():
        from .offline.html_report import token_report_html

        try:
            write_output(html[0], token_report_html(
                report, pred, target, format=format, pairing=pairing, tolerance_ms=tolerance_ms,
                generated_screens=generated_screens, image_tokens=image_tokens, sequences=html[1]))
        except OSError as err:
            print(f"owa-metrics evaluate: {html[0]}: cannot write the HTML report ({err.strerror or err})",
                  file=sys.stderr)
            return 2
        print(f"wrote {html[0]}")
    return 1 if strict and lines else 0


def _evaluate_d2e(pred: Path, target: Path, bin_ms: float | None, empty_bins_as_correct: bool,
                  bin_shifts: list[int] | None, json_path: Path | None, progress: bool | None = None,
                  strict: bool = False, html: tuple[Path, int] | None = None) -> int:
    """The D2E protocol on one MCAP pair, or on two folders' pairs (pooled keys, and a tag per file): its keys as a
    table (and in full in --json), each warning (a file whose mouse it cannot read) a line on stderr (exit 1 with
    ``strict``); bad input: one line, exit 2."""
    import json
    import warnings

    from .offline.d2e import evaluate_d2e, evaluate_d2e_folders
    from .functional import d2e_paper
    from .functional.d2e import bin_ns_of
    from .report import tag_table

    def fail(message: str) -> int:
        print(f"owa-metrics evaluate: {message}".splitlines()[0], file=sys.stderr)
        return 2

    if bin_ms is None:
        return fail("--empty-bins-as-correct and --bin-shifts belong to the D2E protocol: pass --bin-ms too "
                    "(upstream's is 50)")
    if bin_shifts and bin_shifts[0] > bin_shifts[1]:
        return fail(f"--bin-shifts LOW HIGH with LOW <= HIGH, got {bin_shifts[0]} {bin_shifts[1]}")
    try:
        bin_ns_of(bin_ms, "--bin-ms")
    except ValueError as err:
        return fail(str(err))
    folders = pred.is_dir() and target.is_dir()
    for path in (pred, target):
        if not path.exists():
            return fail(f"{path}: does not exist")
        if not folders and (path.suffix != ".mcap" or not path.is_file()):
            return fail(f"{path}: the D2E protocol (--bin-ms) compares two OWA MCAP recordings (.mcap files), or two "
                        "folders of them")
    shifts = range(bin_shifts[0], bin_shifts[1] + 1) if bin_shifts else ()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = evaluate_d2e_folders(pred, target, bin_ms, empty_bins_as_correct, shifts, progress) if folders \
                else evaluate_d2e(pred, target, bin_ms, empty_bins_as_correct, shifts)
    except (ValueError, ImportError) as err:  # a file without screens, no overlap: the message names the file
        return fail(str(err))
    except Exception as err:  # noqa: BLE001 - an unreadable MCAP: one line naming it
        return fail(f"{pred} / {target}: cannot read the MCAP pair ({type(err).__name__}: {err})")
    table, paper = _d2e_lines(report, bin_ms == d2e_paper.BIN_MS and not empty_bins_as_correct)
    tags = tag_table(report)
    print("\n".join([f"# D2E protocol: {pred.name} vs {target.name} ({bin_ms:g} ms bins)", "", *table,
                     *(["", "## Per file", "", tags] if tags else []), "", *paper]))
    warned = list(dict.fromkeys(_cli_words(w.message) for w in caught))  # one file on both sides: once
    for line in warned:
        print(f"owa-metrics evaluate: warning: {line}", file=sys.stderr)
    if json_path and _rank_zero():
        try:
            write_output(json_path, json.dumps(report, indent=1) + "\n")
        except OSError as err:
            return fail(f"{json_path}: cannot write the JSON report ({err.strerror or err})")
        print(f"wrote {json_path}")
    if html and _rank_zero():
        from .offline.html_report import d2e_report_html

        try:
            write_output(html[0], d2e_report_html(report, pred, target, bin_ms, html[1]))
        except OSError as err:
            return fail(f"{html[0]}: cannot write the HTML report ({err.strerror or err})")
        print(f"wrote {html[0]}")
    return 1 if strict and warned else 0


def _d2e_lines(report: dict, paper: bool) -> tuple[list[str], list[str]]:
    """The pooled ``d2e/...`` keys as a markdown table, and what follows the report: with ``paper`` (the paper's
    protocol: 50 ms bins, no empty bins) the D2E paper's G-IDM mean is a column beside each key it reports and its
    per-game table follows (`functional.d2e_paper`), else a line says why they are left out."""
    from .functional import d2e_paper

    keys = [(key, value) for key, value in report.items() if not key.startswith("tag/")]
    if not paper:
        return ["| key | value |", "|---|---:|", *(f"| {key} | {value:.6g} |" for key, value in keys)], [
            f"The D2E paper's G-IDM figures (docs/METRICS.md) are at {d2e_paper.BIN_MS} ms bins without empty bins: "
            f"run with --bin-ms {d2e_paper.BIN_MS} (and no --empty-bins-as-correct) to see them beside yours."]
    ref = {f"d2e/{key}": f"{value:g}" for key, value in zip(d2e_paper.KEYS, d2e_paper.MEAN[1:])}
    names = [key.rsplit("/", 1)[1] for key in d2e_paper.KEYS]
    return ["| key | value | D2E paper, G-IDM (mean of its games) |", "|---|---:|---:|",
            *(f"| {key} | {value:.6g} | {ref.get(key, '')} |" for key, value in keys)], [
        "## The D2E paper's G-IDM per game (τ = 100 ms)", "", f"| game | {' | '.join(names)} |",
        "|---" + "|---:" * len(names) + "|",
        *(f"| {row[0]} | " + " | ".join(f"{v:g}" for v in row[1:]) + " |" for row in (*d2e_paper.PER_GAME,
                                                                                  d2e_paper.MEAN)),
        "", f"Source: {d2e_paper.SOURCE}."]


def _cli_words(warning: Warning) -> str:
    """A warning raised while evaluating, in the command's words (its flags, not Python argument names); one that
    this command does not know: the first line of its message."""
    from .offline.evaluate import FormatGuessWarning, UndecodedTargetsWarning
    from .tokens.codec import FORMATS

    if isinstance(warning, FormatGuessWarning):
        return (f"{warning.path}: its tokens do not tell the token format (screens only, every digit < 10): "
                "hierarchical assumed; pass --format to be sure, since the formats' timestamp windows differ "
                "(16 s vs 10 s)")
    if isinstance(warning, UndecodedTargetsWarning):
        others = [name for name in FORMATS if name != warning.format]
        fix = f"; if the files are in the {' or '.join(others)} format, pass --format {' | '.join(others)}" \
            if warning.reason == "invalid_format" else ""
        if warning.image_tokens:  # the screens hold another model's image tokens: the format is not the fix
            fix = (f"; its screens hold image tokens that are not the ones read ({', '.join(warning.image_tokens[:3])}): "
                   f"pass --image-tokens {warning.vlm or repr('PREFIX IMAGE x COUNT SUFFIX')}")
        return (f"{warning.path}: {warning.count} of {warning.total} true events ({warning.count / warning.total:.0%}) "
                f"do not decode in the {warning.format} format (most often: {warning.reason}) and are left out of "
                f"every rate{fix}")
    return str(warning).splitlines()[0].removeprefix("owa_metrics: ")


def output_is_input(outputs: dict[str, Optional[Path]], inputs: list[Path]) -> Optional[str]:
    """What is wrong when an output flag's path (``outputs``: flag -> path or None) is an existing regular file that is
    also an input: the same file under any name (a symlink, a hard link, ``./``), or an ``.mcap`` file of an input
    folder. Writing would replace it; None when no output is an input (pipes and devices are written through, never
    replaced: `write_output`)."""
    import os
    import stat

    read = {}  # (device, inode) -> the input path
    for path in inputs:
        for file in sorted(path.glob("*.mcap")) if path.is_dir() else [path]:
            with contextlib.suppress(OSError):
                found = os.stat(file)
                read.setdefault((found.st_dev, found.st_ino), file)
    for flag, path in outputs.items():
        try:
            found = os.stat(path) if path is not None else None
        except OSError:
            continue
        if found is not None and stat.S_ISREG(found.st_mode) and (found.st_dev, found.st_ino) in read:
            same = read[(found.st_dev, found.st_ino)]
            named = "" if str(same) == str(path) else f" (the input {same})"
            return f"{path}: {flag} names an input file{named}: writing there would replace it; choose another path"
    return None


def write_output(path: Path, text: str) -> None:
    """Every file the CLI writes: a regular (or new) file is replaced atomically (written beside it, then renamed;
    the partial file removed when anything fails); anything else that exists (a FIFO, a device such as /dev/null or
    /dev/stdout) is written through, never replaced. Raises OSError (a directory: IsADirectoryError)."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "is a directory", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return
    real = Path(os.path.realpath(path))  # a link to a regular file: replace the file, keep the link
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = real.with_name(f".{real.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _inspect(paths: list[Path], max_tokens: int, format: str) -> int:
    """Each recording -> events -> tokens -> batch decoder; prints what came back and how fast (the first decode,
    which compiles numba's kernels or loads them from its cache, timed apart)."""
    import torch

    from . import Category, EventCodec, Status, VocabMap, build_tokenizer, decode_batch
    from .decode import kernel
    from .tokens.codec import EventEncodeError
    from .events import read_recording

    vocab = VocabMap.from_tokenizer(build_tokenizer(format=format))
    codec = EventCodec(vocab.config)
    header = ("recording", "events", "keyboard", "mouse_op", "mouse_nop", "screen", "tokens", "round_trip",
              "decoded_ok", "decode_ms")
    rows, first_ms = [], None
    for path in paths:
        try:
            events = read_recording(path, format=format)
        except Exception as err:  # noqa: BLE001 - report any unreadable file in one line
            print(f"owa-metrics: cannot read {path}: {err}".splitlines()[0], file=sys.stderr)
            return 2
        try:
            counts = collections.Counter(e.category for e in events)
            round_trip = sum(codec.decode(codec.encode(e)).kind == e.kind for e in events)
            sequences = vocab.encode_sequences(events, max_tokens, ignore_images=True)
        except EventEncodeError as err:
            print(f"owa-metrics inspect: {path}: a recorded event the {format} format cannot write ({err})",
                  file=sys.stderr)
            return 2
        except ValueError as err:  # an event longer than the sequences
            print(f"owa-metrics inspect: {path}: {err}: raise --max-tokens".splitlines()[0], file=sys.stderr)
            return 2
        width = max((len(s) for s in sequences), default=1)
        target = torch.tensor([s + [-100] * (width - len(s)) for s in sequences] or [[-100]])
        if first_ms is None:
            first_ms = _timed_ms(decode_batch, target.clamp(min=0), target, vocab)[1]
        batch, elapsed_ms = _timed_ms(decode_batch, target.clamp(min=0), target, vocab)
        ok = int((batch.status == int(Status.VALID)).sum())
        rows.append((path.name, len(events), counts[Category.KEYBOARD], counts[Category.MOUSE_OP],
                     counts[Category.MOUSE_NOP], counts[Category.SCREEN], int((target >= 0).sum()),
                     f"{round_trip}/{len(events)}", f"{ok}/{len(batch)}", f"{elapsed_ms:.1f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    why = "numba compiles its kernels or loads them from its cache" if kernel.available() else "the torch path"
    print(f"first decode: {first_ms:.1f} ms, once per process ({why}); decode_ms leaves it out")
    return 0


def _timed_ms(fn, *args):
    """``(fn(*args), milliseconds it took)``."""
    begin = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - begin) * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
