"""Token files streamed (owa_metrics.offline.streaming) and sharded over processes; D2E folders under torchrun.

The compiled tokenizer is held to the readable path (`read_tagged` + the regex `tokenize`) line by line, on lines
made to hit every rule; the streamed report to one update of the whole files read the readable way; two torchrun
processes to one process, on token files and on a folder of MCAP pairs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from owa_metrics import OWAEventMetrics
from owa_metrics.offline import streaming
from owa_metrics.cli import main
from owa_metrics.offline.evaluate import _pad, guess_format, read_tagged, tokenize
from owa_metrics.tokens.vocab import VocabMap, build_tokenizer

from d2e_oracle import oracle

E = "<EVENT_START><KEYBOARD><1><0><0><65><press><EVENT_END>"
S = "<EVENT_START><SCREEN><1><5><0><fake_image_placeholder><EVENT_END>"
TEXT_LINES = [E + S, f"say {E} hi {S}!", "a<b<c>d>e<>", "<EVENT_START><no_such_token><EVENT_END>", f"  {E}\t",
              f"\u3000{E}\u3000", f"\x1c{E}", "", "   ", f"{E}\r", f"{S}é{E}", "<xake_image_placeholder>" + S,
              "<EVENT_START><SCREEN><1><5><0><fake_image_placeholderX><EVENT_END>", "plain words", E * 40]
JSON_LINES = [json.dumps({"text": E + S}), json.dumps({"text": S}, separators=(",", ":")),
              json.dumps({"text": E, "tag": "b"}), json.dumps({"tag": "b", "text": S}), json.dumps(E),
              json.dumps({"text": E}, ensure_ascii=True).replace("<", "\\u003c"),
              '{"text": "<EVENT_END>", "text": "' + E + '"}', json.dumps({"text": f" {E} "}),
              json.dumps({"text": f"{E}\t{S}"}), json.dumps({"text": "é" + E}, ensure_ascii=False), "",
              json.dumps({"text": E, "tag": "a", "more": [1, 2]}), json.dumps({"text": ""}) + "\r"]


def _streamed(path: Path, table) -> tuple[list[list[int]], list]:
    (index,), _ = streaming.line_indexes([path])
    lines = streaming.InputLines(path, table, 0, index.lines, 0)
    ids, counts, tags = lines.take(index.lines)
    return [row.tolist() for row in np.split(ids, np.cumsum(counts)[:-1])], tags


@pytest.mark.parametrize("block", [64, 1 << 20])
def test_the_compiled_tokenizer_reads_every_line_as_the_readable_path(tmp_path, monkeypatch, block):
    monkeypatch.setattr(streaming, "BLOCK_BYTES", block)  # 64: lines across blocks, longer than a block
    tokenizer = build_tokenizer()
    vocab, unk = tokenizer.get_vocab(), tokenizer.unk_token_id
    table, got = streaming.TokenTable(vocab, unk), {}
    for name, lines in (("t.txt", TEXT_LINES), ("t.jsonl", JSON_LINES)):
        path, last = tmp_path / name, E if name.endswith("txt") else json.dumps({"text": E})
        path.write_text("\n".join(lines) + "\n" + last)  # the last line without a line break
        texts, tags = read_tagged(path)
        ids, streamed_tags = _streamed(path, table)
        assert ids == [tokenize(text, vocab, unk) for text in texts]
        assert streamed_tags == (tags or [None] * len(texts))
        got[name] = ids, streamed_tags
    key_a = [vocab[t] for t in ("<EVENT_START>", "<KEYBOARD>", "<1>", "<0>", "<0>", "<65>", "<press>", "<EVENT_END>")]
    (text_ids, _), (json_ids, json_tags) = got["t.txt"], got["t.jsonl"]
    assert unk in text_ids[3] and text_ids[-1] == key_a and len(text_ids) == len(TEXT_LINES) + 1
    assert json_ids[5] == json_ids[6] == key_a and json_tags[2:4] == ["b", "b"] and json_tags[11] == "a"
    bad = tmp_path / "bad.jsonl"  # a line that only the full JSON parse refuses (a comma before the brace)
    bad.write_text(JSON_LINES[0] + "\n" + '{"text": "' + E + '",}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not JSON"):
        _streamed(bad, table)


@pytest.mark.parametrize("ending", ["\n", ""])
def test_the_blocks_scans_index_lines_and_tags_as_a_plain_split(tmp_path, monkeypatch, ending):
    """`line_indexes` from blocks of 64 bytes in pieces of 24 (each rank scans a share of them: every block alone
    here): lines across blocks and longer than one, a line break at a block's last byte, tags on lines that cross a
    block's end, an escaped "tag" key, a line that does not parse; against the file split into lines in Python."""
    monkeypatch.setattr(streaming, "SCAN_BYTES", 64)
    monkeypatch.setattr(streaming, "PIECE_BYTES", 24)  # 24 + 24 + 16
    monkeypatch.setattr(streaming, "MIN_CHUNK_PIECES", 2)
    rows = [json.dumps({"text": E * (k % 4), **({"tag": f"t{k % 5}"} if k % 3 else {})}) for k in range(40)]
    rows[7] = '{"text": "x", "t\\u0061g": "escaped"}'
    rows[9] = '{"text": "x", "tag": "bad'  # does not parse: left to the reading pass
    start = len("\n".join(rows[:11])) + 1
    end = (start + 12) // 64 * 64 + 63
    rows[11] = '{"text": "' + "y" * (end - start - 12) + '"}'  # its line break at a block's last byte
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(rows) + ending)
    data = path.read_bytes()
    (index,), (tags,) = streaming.line_indexes([path])
    assert index.lines == len(rows)
    starts = [0] + [k + 1 for k, byte in enumerate(data) if byte == 10 and k + 1 < len(data)]
    assert [index.offset_of(k) for k in range(len(rows))] == starts
    want = {}
    for number, row in enumerate(rows):
        try:
            item = json.loads(row)
        except ValueError:
            continue
        if "tag" in item:
            want.setdefault(item["tag"], number)
    assert tags == want and want["escaped"] == 7
    blocks = -(-len(data) // 64)
    one = streaming.scan_blocks(path, range(blocks))
    assert [streaming.scan_blocks(path, range(b, b + 1))[0] for b in range(blocks)] == one  # any share of them
    assert any(data[64 * b - 1] == 10 for b in range(1, blocks))  # a line break at a block's last byte
    pieces = [64 * b + at for b in range(blocks) for at in (0, 24, 48) if 64 * b + at < len(data)]
    assert len(pieces) > 4 * 3 * 2  # the first chunks more than the least (2 pieces here) on 1 to 3 ranks
    for world in (1, 2, 3):  # the chunks the ranks claim: every line once, in order, guided sizes in pieces
        spans = streaming.chunks(index, world)
        assert [line for first, last in spans for line in range(first, last)] == list(range(len(rows)))
        assert all(first < last for first, last in spans) and len(spans) > 5
        cut, firsts = 0, set()  # each chunk max(2, ceil(pieces left / (4 world))) pieces, from the line holding
        while cut < len(pieces):  # its first piece's first byte
            firsts.add(data[:pieces[cut]].count(b"\n"))
            cut += max(2, -(-(len(pieces) - cut) // (4 * world)))
        assert [first for first, _ in spans] == sorted(firsts)


def _files(tmp_path, n=60, tagged=True, factorized_from=None):
    """A prediction and a target JSONL file of ``n`` sequences from the real recordings' events."""
    from owa_metrics import CodecConfig, EventCodec
    from owa_metrics.events import read_recording

    from conftest import recording_paths

    events = [e for p in recording_paths() for e in read_recording(p)]
    rng = np.random.default_rng(0)
    pred, true = tmp_path / "pred.jsonl", tmp_path / "true.jsonl"
    with open(pred, "w") as p, open(true, "w") as t:
        for k in range(n):
            codec = EventCodec(CodecConfig.preset("factorized" if factorized_from is not None and k >= factorized_from
                                                  else "hierarchical"))
            if factorized_from is not None and k < factorized_from:
                chosen = [e for e in events if e.kind == "screen"][k:k + 3]
            else:
                start = int(rng.integers(0, len(events) - 40))
                chosen = events[start:start + int(rng.integers(1, 40))]
            text = "".join(codec.encode(e) for e in chosen)
            guess = "".join(codec.encode(e) for e in chosen[int(rng.integers(0, 2)):])
            t.write(json.dumps({"text": text, **({"tag": f"g{k % 3}"} if tagged else {})}) + "\n")
            p.write(json.dumps({"text": guess}) + "\n")
    return pred, true


def _whole(pred, true, tags=("g0", "g1", "g2")):
    """One update of the whole files, read the readable way (the reference the streamed pass must equal)."""
    (p, _), (t, t_tags) = read_tagged(pred), read_tagged(true)
    tokenizer = build_tokenizer(format=guess_format(t, p))
    metric = OWAEventMetrics(vocab=VocabMap.from_tokenizer(tokenizer), alignment="generation", tags=list(tags))
    words = tokenizer.get_vocab()
    metric.update(_pad([tokenize(x, words, tokenizer.unk_token_id) for x in p]),
                  _pad([tokenize(x, words, tokenizer.unk_token_id) for x in t]), tags=t_tags)
    return {k: float(v) for k, v in metric.compute().items()}


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-12), key


def test_streamed_evaluate_equals_one_update_of_the_whole_files(tmp_path, monkeypatch):
    pred, true = _files(tmp_path)
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 2048)  # many blocks, many updates
    monkeypatch.setattr(streaming, "TARGET_TOKENS", 300)
    monkeypatch.setattr(streaming, "WINDOW_TOKENS", 1000)  # windows of several blocks
    monkeypatch.setattr(streaming, "SCAN_BYTES", 1000)  # the line index and tags from many blocks
    out = tmp_path / "report.json"
    assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    _same(report, _whole(pred, true))
    assert report["tag/g1/count/sequences"] == 20 and report["count/sequences"] == 60
    # the first block holds screens only (no format told); a later one factorized keys: the whole files decide
    pred, true = _files(tmp_path, n=40, tagged=False, factorized_from=30)
    assert guess_format(read_tagged(true)[0]) == "factorized"
    assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (p, _), (t, _) = read_tagged(pred), read_tagged(true)
    tokenizer = build_tokenizer(format="factorized")
    metric = OWAEventMetrics(tokenizer, alignment="generation")
    words, unk = tokenizer.get_vocab(), tokenizer.unk_token_id
    metric.update(_pad([tokenize(x, words, unk) for x in p]), _pad([tokenize(x, words, unk) for x in t]))
    _same(report, {k: float(v) for k, v in metric.compute().items()})
    assert report["status/valid"] > 0 and report["status/invalid_target"] == 0


def _torchrun(tmp_path, *commands: list) -> subprocess.CompletedProcess:
    """One launch of two torchrun processes running ``owa-metrics`` (`owa_metrics.cli.main`, as ``python -m
    owa_metrics``) once per command in one gloo process group (one launch serves several checks: each costs
    seconds); a command ``["chunks", n, ...]`` first sets the line index's blocks to ``n`` bytes (many chunks). Then
    each rank writes ``claims_{rank}.json``: the chunks it claimed of 40, from the store, with no store (chunk k to
    rank k % 2) and with rank 1 alone without one (the ranks agree: k % 2)."""
    script = tmp_path / "commands.py"
    script.write_text("import json, sys\nimport torch.distributed as dist\nfrom owa_metrics.offline import streaming\n"
                      "from owa_metrics.cli import main\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                      "def run(args):\n"
                      "    if args[0] == 'chunks':\n"
                      "        streaming.SCAN_BYTES, args = int(args[1]), args[2:]\n"
                      "    return main(args)\n"
                      f"codes = [run(args) for args in {[list(map(str, c)) for c in commands]!r}]\n"
                      "claims = [list(streaming.Claims(40))]\nstore = streaming._store\n"
                      "streaming._store = lambda: None\nclaims.append(list(streaming.Claims(40)))\n"
                      "streaming._store = store if rank == 0 else streaming._store\n"
                      "claims.append(list(streaming.Claims(40)))\n"
                      f"open(f'{tmp_path}/claims_{{rank}}.json', 'w').write(json.dumps(claims))\n"
                      "dist.destroy_process_group()\nsys.exit(max(codes))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_two_torchrun_processes_equal_one_on_token_files_and_on_a_folder(tmp_path, d2e_pairs):
    pred, true = _files(tmp_path)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    page_one, page_two = tmp_path / "one.html", tmp_path / "two.html"
    assert main(["evaluate", "--pred", str(pred), "--target", str(true), "--json", str(one), "--html", str(page_one)]) == 0
    preds, truths = tmp_path / "preds", tmp_path / "truths"
    preds.mkdir(), truths.mkdir()
    for k, (truth, guess) in enumerate(d2e_pairs):
        (truths / f"rec{k}.mcap").write_bytes(Path(truth).read_bytes())
        (preds / f"rec{k}.mcap").write_bytes(Path(guess).read_bytes())
    args = ["--pred", str(preds), "--target", str(truths), "--bin-ms", "50"]
    folder_one, folder_two = tmp_path / "folder_one.json", tmp_path / "folder_two.json"
    assert main(["evaluate", *args, "--json", str(folder_one)]) == 0
    many = tmp_path / "many.json"  # the files in many chunks (blocks of 2 kB): the ranks claim them in turn
    done = _torchrun(tmp_path, ["evaluate", "--pred", pred, "--target", true, "--json", two, "--html", page_two],
                     ["chunks", 2048, "evaluate", "--pred", pred, "--target", true, "--json", many],
                     ["evaluate", *args, "--json", folder_two])
    assert done.stdout.count("OWA event metrics") == 2  # rank 0 alone prints
    assert done.stdout.count(f"wrote {page_two}") == 1 and page_two.read_bytes() == page_one.read_bytes()  # rank 0's
    _same(json.loads(two.read_text()), json.loads(one.read_text()))
    _same(json.loads(many.read_text()), json.loads(one.read_text()))
    claims = [json.loads((tmp_path / f"claims_{rank}.json").read_text()) for rank in range(2)]
    for first, second in zip(*claims):  # every chunk once, each rank's in increasing order
        assert sorted(first + second) == list(range(40)) and first == sorted(first) and second == sorted(second)
    for way in (1, 2):  # no store, or rank 1 alone without one: chunk k to rank k % 2
        assert claims[0][way] == list(range(0, 40, 2)) and claims[1][way] == list(range(1, 40, 2))
    report = json.loads(folder_one.read_text())
    files = [oracle(truths / f"rec{k}.mcap", preds / f"rec{k}.mcap", 50) for k in range(len(d2e_pairs))]
    for k, want in enumerate(files):  # each file alone, as a tag
        assert {key[len(f"tag/rec{k}/d2e/"):]: v for key, v in report.items() if key.startswith(f"tag/rec{k}/")} \
            == pytest.approx(want, rel=1e-9)
    for key in ("num_bins", "mouse_move/sample_count", "mouse_button/sample_count", "keyboard/sample_count"):
        assert report[f"d2e/{key}"] == sum(f[key] for f in files)  # pooled: every file's bins together
    for key, count in (("keyboard/key_accuracy", "keyboard/sample_count"),
                       ("mouse_button/button_accuracy", "mouse_button/sample_count")):
        right = sum(f.get(key, 0) * f[count] for f in files)
        assert report[f"d2e/{key}"] == pytest.approx(right / sum(f[count] for f in files), rel=1e-12)
    assert done.stdout.count("# D2E protocol") == 1
    assert json.loads(folder_two.read_text()) == report
    (preds / "rec0.mcap").rename(preds / "other.mcap")  # a file in one folder only: one line naming it, exit 2
    assert main(["evaluate", *args]) == 2


def test_the_line_scan_finds_a_tag_key_or_an_escape_where_bytes_find_does():
    """`_may_tag` (quotes in numpy) says what ``b'"tag"' in data or b"\\\\" in data`` says, on random short texts of
    the bytes that matter (and at the ends of a buffer)."""
    rng = np.random.default_rng(31)
    alphabet = np.frombuffer(b'"tag\\x<>', np.uint8)
    found = 0
    for n in [0, 1, 4, 5, 6] + list(rng.integers(0, 40, 2000)):
        data = alphabet[rng.choice(len(alphabet), n, p=[0.3, 0.2, 0.2, 0.2, 0.01, 0.03, 0.03, 0.03])].tobytes()
        want = b'"tag"' in data or b"\\" in data
        assert streaming._may_tag(data) == want, data
        found += want
    assert 100 < found < 1900
