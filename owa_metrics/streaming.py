"""Token files streamed: read in blocks of whole lines, tokenized by a compiled loop; the ranks' shares and messages.

`owa_metrics.evaluate.evaluate` streams two text / JSONL files through `InputLines` (memory flat in the files'
size: a block of lines at a time; one line is held whole), sharded over the ranks of ``torch.distributed`` (each
rank takes a contiguous range of lines, split at equal shares of the target file's bytes: `shard`; `exchange` and
`raise_first` keep every rank in step).

Tokenizing: `TokenTable.tokenize` reads a block's lines with one compiled pass (numba): a ``.jsonl`` line of the
plain form ``{"text": "..."}`` (a string without escapes, optionally more fields after it: a ``"tag"``) and a text
line are split as `tokenize` splits them (each ``<...>`` a token, each run of other text one, looked up in a table
of the vocabulary's UTF-8 bytes, unknown pieces the unknown id). Every other line (escapes, other layouts,
whitespace or non-ASCII at either end, which ``str.strip`` might remove) goes the readable way,
`owa_metrics.evaluate.read_tagged`'s rules line by line and `tokenize`, which the tests hold the compiled pass to.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .decode import kernel
from .metrics.collection import is_tag_name
from .decode.kernel import _jit, njit

_inline = njit(inline="always", nogil=True, cache=True) if njit is not None else (lambda fn: fn)  # inlined helpers

BLOCK_BYTES = 4 << 20  # a block of whole lines (longer when one line is)
TARGET_TOKENS = 1 << 18  # target tokens per update (at least one line)
MAX_LINES = 4096  # lines per update
_FALLBACK, _TAIL = 1, 2  # `tokenize_block`'s line flags: the readable path; the JSON fields after "text"


class InputError(ValueError):
    """A file the evaluator cannot read; the message names the file and says what is wrong with it."""


_PIECES = re.compile(r"(<[^<>]*>)")


def tokenize(text: str, vocab: dict[str, int], unk_id: int) -> list[int]:
    """The ids `build_tokenizer`'s tokenizer gives ``text`` (each ``<...>`` a token, each run of other text one
    token, unknown pieces ``unk_id``), by a regex split and a dict lookup: ~10x faster on long lines."""
    return [vocab.get(piece, unk_id) for piece in _PIECES.split(text) if piece]


# ------------------------------------------------------------------------------------------- the compiled tokenizer
@_inline
def _slot(w0, w1, length, bits):
    """The home slot of a piece: a multiplicative hash of its last 16 bytes (packed) and its length."""
    x = w0 ^ (w1 * np.uint64(0xC2B2AE3D27D4EB4F)) ^ np.uint64(length)
    return np.int64((x * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits))


@_inline
def _pack(buf, a, b):
    """The last 16 bytes of buf[a:b], packed big-endian into two words (w0: the last 8)."""
    w0, w1 = np.uint64(0), np.uint64(0)
    for i in range(max(a, b - 16), b):
        w1 = (w1 << np.uint64(8)) | (w0 >> np.uint64(56))
        w0 = (w0 << np.uint64(8)) | np.uint64(buf[i])
    return w0, w1


@_jit
def _fill_table(key_bytes, key_start, key_id, bits, words, where, ids):
    mask = ids.shape[0] - 1
    for k in range(key_start.shape[0] - 1):
        a, b = key_start[k], key_start[k + 1]
        w0, w1 = _pack(key_bytes, a, b)
        s = _slot(w0, w1, b - a, bits)
        while ids[s] >= 0:
            s = (s + 1) & mask
        words[s, 0], words[s, 1], where[s, 0], where[s, 1], ids[s] = w0, w1, b - a, a, key_id[k]


@_inline
def _lookup(a, b, w0, w1, bits, words, where, ids, unk):
    """The id of the piece [a, b) whose last 16 bytes are packed in w0, w1 (equal length and last 16 bytes), or
    ``unk``; a longer piece that matches a key so far: ``-2 - slot`` (`_verify` compares its other bytes)."""
    mask = ids.shape[0] - 1
    s = _slot(w0, w1, b - a, bits)
    while ids[s] >= 0:
        if words[s, 0] == w0 and words[s, 1] == w1 and where[s, 0] == b - a:
            return ids[s] if b - a <= 16 else -2 - s
        s = (s + 1) & mask
    return unk


@_jit
def _verify(buf, n, ids, at, counts, words, where, key_ids, key_bytes, unk, unks):
    """The pieces longer than 16 bytes that `_lookup` matched: their other bytes compared (on a difference, the
    table's next keys); then each line's unknown pieces counted."""
    mask = key_ids.shape[0] - 1
    for k in range(n):
        if ids[k] >= -1:
            continue
        s, a = -2 - ids[k], at[k]
        length, w0, w1 = where[s, 0], words[s, 0], words[s, 1]
        ids[k] = unk
        while key_ids[s] >= 0:
            if words[s, 0] == w0 and words[s, 1] == w1 and where[s, 0] == length:
                same = True
                for i in range(length - 16):
                    if key_bytes[where[s, 1] + i] != buf[a + i]:
                        same = False
                        break
                if same:
                    ids[k] = key_ids[s]
                    break
            s = (s + 1) & mask
    k = 0
    for line in range(counts.shape[0]):
        for _ in range(counts[line]):
            if ids[k] == unk:
                unks[line] += 1
            k += 1


@_jit
def _strippable(c):
    """Whether ``str.strip`` could remove the character starting with byte ``c`` (non-ASCII: maybe)."""
    return c >= 128 or 9 <= c <= 13 or 28 <= c <= 32


@_jit
def _tokenize_block(buf, starts, ends, jsonl, bits, words, where, key_ids, unk, ids, at, counts, flags, tails):
    """Each line [starts[l], ends[l]) of ``buf``: its ids appended to ``ids`` (``counts[l]`` of them; ``at``: where
    each piece starts; see `_lookup`), or ``flags[l] = _FALLBACK``; a JSON line with fields after "text":
    ``flags[l] = _TAIL``, ``tails[l]`` where they start (at the comma). Returns the number of ids written."""
    n = 0
    for line in range(starts.shape[0]):
        s, e = starts[line], ends[line]
        if e > s and buf[e - 1] == 13:  # "\r\n"
            e -= 1
        counts[line], flags[line] = 0, 0
        ts, te = s, e
        if jsonl:  # {"text": "...", or {"text":"...
            if not (e - s >= 12 and buf[s] == 123 and buf[s + 1] == 34 and buf[s + 2] == 116 and buf[s + 3] == 101
                    and buf[s + 4] == 120 and buf[s + 5] == 116 and buf[s + 6] == 34 and buf[s + 7] == 58):
                flags[line] = 1
                continue
            ts = s + 8
            if buf[ts] == 32:
                ts += 1
            if buf[ts] != 34:
                flags[line] = 1
                continue
            ts += 1
            te = ts
            while te < e and buf[te] != 34 and buf[te] != 92 and buf[te] >= 32:
                te += 1
            if te >= e or buf[te] != 34:  # an escape, a control character, or no closing quote
                flags[line] = 1
                continue
            if not (te + 2 == e and buf[te + 1] == 125):  # more than "}" after the text
                flags[line], tails[line] = 2, te + 1
        if te <= ts or _strippable(buf[ts]) or _strippable(buf[te - 1]):
            flags[line] = 1
            continue
        begin, i, text = n, ts, ts  # text: where the current run of other text began
        while i < te:
            if buf[i] != 60:  # "<"
                i += 1
                continue
            w0, w1 = np.uint64(60), np.uint64(0)
            j = i + 1
            while j < te and buf[j] != 60 and buf[j] != 62:
                w1 = (w1 << np.uint64(8)) | (w0 >> np.uint64(56))
                w0 = (w0 << np.uint64(8)) | np.uint64(buf[j])
                j += 1
            if j < te and buf[j] == 62:  # a token <...>
                if text < i:
                    t0, t1 = _pack(buf, text, i)
                    ids[n], at[n] = _lookup(text, i, t0, t1, bits, words, where, key_ids, unk), text
                    n += 1
                w1 = (w1 << np.uint64(8)) | (w0 >> np.uint64(56))
                w0 = (w0 << np.uint64(8)) | np.uint64(62)
                ids[n], at[n] = _lookup(i, j + 1, w0, w1, bits, words, where, key_ids, unk), i
                n += 1
                i = text = j + 1
            else:
                i = j
        if text < te:
            t0, t1 = _pack(buf, text, te)
            ids[n], at[n] = _lookup(text, te, t0, t1, bits, words, where, key_ids, unk), text
            n += 1
        counts[line] = n - begin
    return n


class TokenTable:
    """A vocabulary ``{token: id}`` as the compiled tokenizer's table: open addressing over each key's UTF-8 length
    and last 16 bytes (packed in two words; a longer key's other bytes compared when those match)."""

    def __init__(self, vocab: dict[str, int], unk_id: int):
        keys = [k.encode("utf-8") for k in vocab]
        self.vocab, self.unk = vocab, unk_id
        self.key_bytes = np.frombuffer(b"".join(keys) or b"\0", np.uint8)
        key_start = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int64)
        self.bits = max(4, (4 * len(keys)).bit_length())
        self.words, self.where = np.zeros((1 << self.bits, 2), np.uint64), np.zeros((1 << self.bits, 2), np.int64)
        self.ids = np.full(1 << self.bits, -1, np.int64)
        _fill_table(self.key_bytes, key_start, np.array(list(vocab.values()), np.int64), self.bits, self.words,
                    self.where, self.ids)
        self.tokens = {i: t for t, i in vocab.items()}
        self.size = max(max(vocab.values(), default=0), unk_id) + 1

    def tokenize(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, jsonl: bool):
        """``(ids, counts, flags, unks, tails)`` of the lines [starts, ends) of ``buf`` (see `_tokenize_block`)."""
        m = len(starts)
        counts, flags, unks, tails = (np.zeros(m, np.int64) for _ in range(4))
        if not kernel.available():  # no numba (or NUMBA_DISABLE_JIT): every line the readable way
            return np.empty(0, np.int64), counts, flags + _FALLBACK, unks, tails
        ids, at = (np.empty(max(len(buf) // 2 + 2 * m, 1), np.int64) for _ in range(2))
        n = _tokenize_block(buf, starts.astype(np.int64), ends.astype(np.int64), jsonl, self.bits, self.words,
                            self.where, self.ids, self.unk, ids, at, counts, flags, tails)
        _verify(buf, n, ids, at, counts, self.words, self.where, self.ids, self.key_bytes, self.unk, unks)
        return ids[:n], counts, flags, unks, tails


# ------------------------------------------------------------------------------------------------- reading lines
class InputLines:
    """The lines [first, last) of one text / JSONL file, read a block at a time: `take` gives the next ones' ids and
    tags. Keeps what the format guess needs: the ids seen and the ``<...>`` tokens outside the vocabulary."""

    def __init__(self, path: Path, table: TokenTable, first: int, last: int, offset: int):
        self.path, self.table, self.jsonl = path, table, path.suffix == ".jsonl"
        self.line, self.last, self.offset = first, last, offset  # the next line's number (0-based) and byte offset
        self.seen = np.zeros(table.size, bool)
        self.unknown: set[str] = set()
        self.nonblank = False
        self._ids, self._starts, self._counts, self._tags, self._at = np.empty(0, np.int64), [0], [], [], 0

    def __len__(self) -> int:
        """Lines read but not yet taken."""
        return len(self._counts) - self._at

    def counts(self) -> np.ndarray:
        """The token counts of the lines read but not taken (reads a block when there are none)."""
        if not len(self) and self.line < self.last:
            self._read_block()
        return np.asarray(self._counts[self._at:])

    def take(self, k: int) -> tuple[np.ndarray, np.ndarray, list[Optional[str]]]:
        """The next ``k`` lines: their ids (concatenated), token counts and tags (None: untagged)."""
        ids, counts, tags = [], [], []
        while k:
            if not len(self):
                self._read_block()
            n = min(k, len(self))
            ids.append(self._ids[self._starts[self._at]:self._starts[self._at + n]])
            counts += self._counts[self._at:self._at + n]
            tags += self._tags[self._at:self._at + n]
            self._at, k = self._at + n, k - n
        return np.concatenate(ids) if ids else np.empty(0, np.int64), np.array(counts, np.int64), tags

    def _read_block(self) -> None:
        """Read and tokenize the next block of whole lines (at least one, at most those left in the range)."""
        want = self.last - self.line
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(BLOCK_BYTES)
            eof = len(data) < BLOCK_BYTES
            while not eof and b"\n" not in data[-BLOCK_BYTES:]:  # a line longer than a block
                more = f.read(BLOCK_BYTES)
                data, eof = data + more, len(more) < BLOCK_BYTES
        buf = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(buf == 10)
        if eof and len(buf) and (not len(ends) or ends[-1] != len(buf) - 1):  # the last line, without a line break
            ends = np.append(ends, len(buf))
        ends = ends[:want]
        if not len(ends):
            raise RuntimeError(f"{self.path}: fewer lines than counted (did it change while being read?)")
        data = data[:min(int(ends[-1]) + 1, len(data))]
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"{self.path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                             f"{self.offset + err.start}); expected one token sequence per line, or an OWA .mcap "
                             "recording") from None
        buf = buf[:len(data)]
        starts = np.concatenate([[0], ends[:-1] + 1])
        ids, counts, flags, unks, tails = self.table.tokenize(buf, starts, ends, self.jsonl)
        rows, tags = [], []
        for line in np.flatnonzero(flags != 0).tolist():  # the lines the compiled pass left to the readable one
            s, e, number = int(starts[line]), int(ends[line]), self.line + line + 1
            if flags[line] == _TAIL:
                tag = self._tail(data, int(tails[line]), e, number)
                if tag is not _FALLBACK:
                    tags.append((line, tag))
                    continue
            row, tag = self._readable(data[s:e], number)
            rows.append((line, row))
            tags.append((line, tag))
        for line in np.flatnonzero((unks > 0) & (flags != _FALLBACK)).tolist():
            self._unknown(data[starts[line]:ends[line]].decode("utf-8"))
        self.seen[ids] = True
        self.nonblank = self.nonblank or bool((flags != _FALLBACK).any())  # a compiled line holds text
        if rows:  # the readable path's ids in place of the compiled pass's (none: it left those lines)
            pieces = np.split(ids, np.cumsum(counts)[:-1])
            for line, row in rows:
                pieces[line], counts[line] = row, len(row)
            ids = np.concatenate(pieces)
        self._ids, self._counts = ids, counts.tolist()
        self._starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        self._tags = [None] * len(counts)
        for line, tag in tags:
            self._tags[line] = tag
        self._at = 0
        self.line += len(ends)
        self.offset += len(data)

    def _tail(self, data: bytes, tail: int, e: int, number: int):
        """The tag of a plain JSON line with more fields after "text" (`_FALLBACK`: read it the readable way)."""
        rest = data[tail:e].rstrip(b"\r")
        try:
            fields = json.loads(b"{" + rest[1:]) if rest[:1] == b"," else None
        except ValueError:
            fields = None
        if not isinstance(fields, dict) or not fields or "text" in fields:
            return _FALLBACK
        tag = fields.get("tag")
        if tag is not None:
            _check_tag(tag, self.path, number)
        return tag

    def _readable(self, raw: bytes, number: int) -> tuple[np.ndarray, Optional[str]]:
        """One line the way `owa_metrics.evaluate.read_tagged` and `tokenize` read it."""
        line, tag = raw.decode("utf-8"), None
        if line.endswith("\r"):
            line = line[:-1]
        if self.jsonl and line.strip():
            line, tag = json_line(line, self.path, number)
        text = line.strip()
        self.nonblank = self.nonblank or bool(text)
        ids = tokenize(text, self.table.vocab, self.table.unk)
        if self.table.unk in ids:
            self._unknown(text)
        return np.array(ids, np.int64), tag

    def _unknown(self, text: str) -> None:
        self.unknown.update(t for t in _TOKENS.findall(text) if t not in self.table.vocab)

    def held(self) -> set[str]:
        """Every ``<...>`` token of the lines read (as `owa_metrics.evaluate.guess_format` collects them)."""
        tokens = (self.table.tokens.get(i) for i in np.flatnonzero(self.seen).tolist() if i != self.table.unk)
        return {t for t in tokens if t is not None and _TOKENS.fullmatch(t)} | self.unknown


_TOKENS = re.compile(r"<[^<>]*>")


def json_line(line: str, path, number: int) -> tuple[str, Optional[str]]:
    """``(text, tag)`` of line ``number`` of a JSONL file: a JSON string, or an object with ``"text"`` (and a
    ``"tag"``, checked); else an `InputError` naming the file and line."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{number}: not JSON ({err.msg})") from None
    text = item["text"] if isinstance(item, dict) and "text" in item else item
    if not isinstance(text, str):
        raise InputError(f"{path}:{number}: expected a string or an object with a 'text' field")
    tag = item.get("tag") if isinstance(item, dict) else None
    if tag is not None:
        _check_tag(tag, path, number)
    return text, tag


def _check_tag(tag, path, number: int) -> None:
    if not is_tag_name(tag):
        raise InputError(f"{path}:{number}: 'tag' must be a name (a non-empty printable string without '/': no line "
                         f"break or other control character), got {tag!r}")


# ---------------------------------------------------------------------------------------------- ranks and shards
def rank_world() -> tuple[int, int]:
    """This process's rank and the number of ranks (``(0, 1)`` without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def exchange(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` alone."""
    rank, world = rank_world()
    if world == 1:
        return [obj]
    out = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def raise_first(error: Optional[BaseException]) -> None:
    """Every rank raises the first error of the lowest rank that had one (each rank's share of lines follows the
    files' order: the first in the files), or none: no rank is left waiting in a collective."""
    errors = [e for e in exchange(error) if e is not None]
    if errors:
        raise errors[0]


SCAN_BYTES = 16 << 20


class LineIndex:
    """Where a file's lines start, counted once (a pass of ``bytes.count`` per 16 MB): ``lines`` (a final line
    without a line break counts; a file ending in one has no empty last line), `line_at` and `offset_of`."""

    def __init__(self, path: Path):
        self.path, self.blocks, self.size = path, [], 0  # blocks: each block's line breaks
        last = b""
        with open(path, "rb") as f:
            while block := f.read(SCAN_BYTES):
                self.blocks.append(block.count(b"\n"))
                self.size, last = self.size + len(block), block[-1:]
        self.lines = sum(self.blocks) + (last not in (b"", b"\n"))

    def line_at(self, offset: int) -> int:
        """The number of line breaks before byte ``offset``."""
        k = offset // SCAN_BYTES
        with open(self.path, "rb") as f:
            f.seek(k * SCAN_BYTES)
            return sum(self.blocks[:k]) + f.read(offset - k * SCAN_BYTES).count(b"\n")

    def offset_of(self, line: int) -> int:
        """Where line ``line`` (0-based) starts."""
        if line == 0:
            return 0
        before, k = 0, 0
        while before + self.blocks[k] < line:
            before, k = before + self.blocks[k], k + 1
        with open(self.path, "rb") as f:
            f.seek(k * SCAN_BYTES)
            block = np.frombuffer(f.read(SCAN_BYTES), np.uint8)
        return k * SCAN_BYTES + int(np.flatnonzero(block == 10)[line - before - 1]) + 1


def shard(target: LineIndex, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s lines [first, last): contiguous, split at equal shares of the target file's bytes."""
    bounds = [0] + [min(target.line_at(target.size * r // world), target.lines) for r in range(1, world)] + \
        [target.lines]
    return bounds[rank], bounds[rank + 1]


# ------------------------------------------------------------------------------------------------------ evaluate
def line_index(path: Path) -> LineIndex:
    try:
        index = LineIndex(path)
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
    if index.lines == 0:
        raise InputError(f"{path}: no sequences (the file is empty or blank)")
    return index


def check_whole(path: Path, index: LineIndex) -> None:
    """Read every line of a file (any format's tokens): raises `InputError` saying what is wrong with it."""
    from .tokens.vocab import build_tokenizer

    tokenizer = build_tokenizer()
    lines = InputLines(path, TokenTable(tokenizer.get_vocab(), tokenizer.unk_token_id), 0, index.lines, 0)
    while lines.line < index.lines or len(lines):
        lines.take(max(len(lines), 1))
    if not lines.nonblank:
        raise InputError(f"{path}: no sequences (the file is empty or blank)")


HEAD_BYTES = 1 << 18


def head_text(path: Path) -> list[str]:
    """The first 256 kB of a file as text (for a first guess of the token format; the whole files confirm it)."""
    with open(path, "rb") as f:
        return [f.read(HEAD_BYTES).decode("utf-8", errors="replace")]


def tags_in(path: Path, offset: int, lines: int) -> dict[str, int]:
    """The tag names of ``lines`` lines of a JSONL file from byte ``offset``, each with the line (counted from 0 at
    ``offset``) where it first appears: the lines that may hold one (a "tag" key, or an escape) parsed; a line that
    does not parse is left to the reading pass, which says what is wrong."""
    names: dict[str, int] = {}
    seen = 0
    if path.suffix != ".jsonl":
        return names
    with open(path, "rb") as f:
        f.seek(offset)
        rest = b""
        while lines > 0:
            block = f.read(BLOCK_BYTES)
            data, rest = rest + block, b""
            if block:  # whole lines only; the rest starts the next block
                cut = data.rfind(b"\n") + 1
                data, rest = data[:cut], data[cut:]
            count = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
            if b'"tag"' in data or b"\\" in data:
                for number, line in enumerate(data.split(b"\n")[:min(count, lines)], seen):
                    if b'"tag"' in line or b"\\" in line:
                        try:
                            item = json.loads(line)
                        except ValueError:
                            continue
                        tag = item.get("tag") if isinstance(item, dict) else None
                        if is_tag_name(tag):
                            names.setdefault(tag, number)
            lines, seen = lines - count, seen + count
            if not block:
                break
    return names


def row_tags(paths, file_tags, tagged: tuple, line: int) -> Optional[list[str]]:
    """Each line's tag: from the files with tags, which must then tag every line and agree (as
    `owa_metrics.evaluate._tags` checks)."""
    files = [(path, tags) for path, tags, names in zip(paths, file_tags, tagged) if names]
    for path, tags in files:
        if None in tags:
            raise InputError(f"{path}:{line + tags.index(None) + 1}: no 'tag', while other lines have one: tag every "
                             "sequence or none")
    if len(files) == 2 and files[0][1] != files[1][1]:
        k = next(k for k, (a, b) in enumerate(zip(files[0][1], files[1][1])) if a != b)
        raise InputError(f"{files[0][0]}:{line + k + 1} is tagged {files[0][1][k]!r} but {files[1][0]}:{line + k + 1} "
                         f"{files[1][1][k]!r}: tag one file, or both alike")
    return files[0][1] if files else None


def padded(ids: np.ndarray, counts: np.ndarray) -> torch.Tensor:
    """[lines, max(count, 1)] ids, each line's then -100."""
    out = np.full((len(counts), max(int(counts.max(initial=0)), 1)), -100, np.int64)
    out[np.arange(out.shape[1]) < counts[:, None]] = ids
    return torch.from_numpy(out)
