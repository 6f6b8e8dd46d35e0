"""The ``owa-metrics`` command."""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

FORMAT_NAMES = ("hierarchical", "factorized")


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="owa-metrics", description="Event metrics for OWA desktop agents.")
    parser.add_argument("--version", action="version", version=f"owa-metrics {__version__}")
    commands = parser.add_subparsers(dest="command")
    inspect = commands.add_parser("inspect", help="decode OWA recordings (MCAP) through the token format and report")
    inspect.add_argument("paths", nargs="+", type=Path, help="OWA .mcap recordings")
    inspect.add_argument("--max-tokens", type=int, default=2048, help="sequence length of the token batches")
    inspect.add_argument("--format", choices=FORMAT_NAMES, default="hierarchical", help="the token format")
    demo = commands.add_parser("demo", help="train a tiny causal LM on event tokens and log the event metrics")
    demo.add_argument("--config", help="YAML settings (configs/demo.yaml)")
    demo.add_argument("--epochs", type=int)
    demo.add_argument("--logger", choices=["tensorboard", "csv", "wandb"])
    demo.add_argument("--mcap", nargs="+", type=Path, help="real OWA recordings instead of the simulator")
    demo.add_argument("--out", help="log directory (default runs/demo)")
    demo.add_argument("--format", choices=FORMAT_NAMES, help="the token format (default hierarchical)")
    evaluate = commands.add_parser("evaluate", help="compare predicted with true event sequences from files")
    evaluate.add_argument("--pred", required=True, type=Path, help="OWA .mcap, or text / .jsonl: one sequence a line")
    evaluate.add_argument("--target", required=True, type=Path, help="the same, for the true events")
    evaluate.add_argument("--mode", choices=["exact", "sketch"], default="exact")
    evaluate.add_argument("--json", type=Path, help="also write every metric to this JSON file")
    evaluate.add_argument("--format", choices=FORMAT_NAMES, help="the token format (default: the target file's)")
    evaluate.add_argument("--pairing", choices=["index", "time"], default="index",
                          help="pair the k-th events (index) or match events within --tolerance-ms (time)")
    evaluate.add_argument("--tolerance-ms", type=float, default=100.0, help="time pairing's tolerance (ms)")
    evaluate.add_argument("--strict", action="store_true", help="exit 1 when there are warnings (e.g. no event decodes)")
    args = parser.parse_args(argv)
    if args.command == "inspect":
        return _inspect(args.paths, args.max_tokens, args.format)
    if args.command == "demo":
        from .demo import main as demo_main
        from .evaluate import InputError

        try:
            return demo_main(args.config, args.epochs, args.logger, args.mcap, args.out, args.format)
        except InputError as err:
            print(f"owa-metrics demo: {err}".splitlines()[0], file=sys.stderr)
            return 2
    if args.command == "evaluate":
        return _evaluate(args.pred, args.target, args.mode, args.json, args.format, args.strict, args.pairing,
                         args.tolerance_ms)
    parser.print_help()
    return 0


def _evaluate(pred: Path, target: Path, mode: str, json_path: Path | None, format: str | None, strict: bool,
              pairing: str = "index", tolerance_ms: float = 100.0) -> int:
    import json
    import warnings

    from .evaluate import FormatGuessWarning, InputError, evaluate, evaluation_warnings
    from .report import format_report

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FormatGuessWarning)
            report = evaluate(pred, target, mode, format=format, pairing=pairing, tolerance_ms=tolerance_ms)
    except (InputError, ImportError) as err:
        print(f"owa-metrics evaluate: {err}".splitlines()[0], file=sys.stderr)
        return 2
    except ValueError as err:  # e.g. the two files hold different numbers of sequences
        print(f"owa-metrics evaluate: {err}".splitlines()[0], file=sys.stderr)
        return 2
    for other in caught:  # give back what this command does not report itself
        if not issubclass(other.category, FormatGuessWarning):
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    print(format_report(report, f"OWA event metrics: {pred.name} vs {target.name}", alignment="generation"))
    lines = [str(w.message) for w in caught if issubclass(w.category, FormatGuessWarning)]
    lines += evaluation_warnings(report, pred, target)
    for line in lines:
        print(f"owa-metrics evaluate: warning: {line}", file=sys.stderr)
    if json_path:
        try:
            write_output(json_path, json.dumps(report, indent=1) + "\n")
        except OSError as err:
            print(f"owa-metrics evaluate: {json_path}: cannot write the JSON report ({err.strerror or err})",
                  file=sys.stderr)
            return 2
        print(f"wrote {json_path}")
    return 1 if strict and lines else 0


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
    """Each recording -> events -> tokens -> batch decoder; prints what came back and how fast."""
    import torch

    from . import Category, EventCodec, Status, VocabMap, build_tokenizer, decode_batch
    from .tokens.codec import EventEncodeError
    from .events import read_recording

    vocab = VocabMap.from_tokenizer(build_tokenizer(format=format))
    codec = EventCodec(vocab.config)
    header = ("recording", "events", "keyboard", "mouse_op", "mouse_nop", "screen", "tokens", "round_trip",
              "decoded_ok", "decode_ms")
    rows = []
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
        begin = time.perf_counter()
        batch = decode_batch(target.clamp(min=0), target, vocab)
        elapsed_ms = (time.perf_counter() - begin) * 1e3
        ok = int((batch.status == int(Status.VALID)).sum())
        rows.append((path.name, len(events), counts[Category.KEYBOARD], counts[Category.MOUSE_OP],
                     counts[Category.MOUSE_NOP], counts[Category.SCREEN], int((target >= 0).sum()),
                     f"{round_trip}/{len(events)}", f"{ok}/{len(batch)}", f"{elapsed_ms:.1f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
