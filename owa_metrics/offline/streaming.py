"""Token files streamed: read in blocks of whole lines, tokenized by a compiled loop; the ranks' shares and messages.

`evaluate.evaluate` streams two text / JSONL files through `InputLines` (memory flat in the files'
size: a block of lines at a time; one line is held whole), sharded over the ranks of ``torch.distributed``: each
rank scans an equal share of each file's blocks for line breaks and tags (`line_indexes`; one `exchange` gives
every rank the whole index), then claims `chunks` of lines one after the other (`Claims`: the next unclaimed one,
so that a slower rank takes fewer) and seeks to each in both files (`LineIndex.offset_of`: the k-th prediction is
paired with the k-th target by line number); `exchange` and `raise_first` keep every rank in step. Each `window` of
lines goes to the metric in `batches` of alike lengths, each `padded` to its longest line.

Tokenizing: `_tokenize_block` reads a block's lines with one compiled pass (numba) over the offsets of its special
bytes (``<`` ``>`` ``"`` ``\\`` and control characters, `_specials`): a ``.jsonl`` line of the plain form
``{"text": "..."}`` (a string without escapes, optionally more fields after it: a ``"tag"``) and a text line are
split as `tokenize` splits them (each ``<...>`` a token, each run of other text one, looked up in `TokenTable`,
unknown pieces the unknown id). Every other line (escapes, other layouts, whitespace or non-ASCII at either end,
which ``str.strip`` might remove) goes the readable way, `evaluate.read_tagged`'s rules line by line and
`tokenize`, which the tests hold the compiled pass to.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import uuid
import weakref
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..decode import kernel
from ..metrics.arguments import is_tag_name
from ..decode.kernel import _jit, njit

_inline = njit(inline="always", nogil=True, cache=True) if njit is not None else (lambda fn: fn)  # inlined helpers

BLOCK_BYTES = 4 << 20  # a block of whole lines (longer when one line is)
TARGET_TOKENS = 1 << 18  # target tokens per update (at least one line)
MAX_LINES = 4096  # lines per update
WINDOW_TOKENS = 4 * TARGET_TOKENS  # target tokens read at a time (whole blocks of the target), sorted into batches
_FALLBACK, _TAIL = 1, 2  # `_tokenize_block`'s line flags: the readable path; the JSON fields after "text"


class InputError(ValueError):
    """A file the evaluator cannot read; the message names the file and says what is wrong with it."""


_PIECES = re.compile(r"(<[^<>]*>)")


def tokenize(text: str, vocab: dict[str, int], unk_id: int) -> list[int]:
    """The ids `build_tokenizer`'s tokenizer gives ``text`` (each ``<...>`` a token, each run of other text one
    token, unknown pieces ``unk_id``), by a regex split and a dict lookup: ~10x faster on long lines."""
    return [vocab.get(piece, unk_id) for piece in _PIECES.split(text) if piece]


# ------------------------------------------------------------------------------------------- the compiled tokenizer
_SPECIAL = np.zeros(256, np.uint8)  # the bytes the line parser stops at: < > " \ and the control characters
_SPECIAL[[60, 62, 34, 92]], _SPECIAL[:32] = 1, 1
_MASKS = np.array([0] + [(1 << (8 * k)) - 1 for k in range(1, 8)] + [(1 << 64) - 1], np.uint64)  # k low bytes
PAD_BYTES = 24  # zeros after a block's bytes: the 8-byte loads of `_word` read past its end


@_inline
def _word(w8, a, b):
    """Bytes [a, min(a + 8, b)) of the buffer whose 8-byte words are ``w8`` (little-endian, zeros above; 0 when
    b <= a): two aligned loads, no loop."""
    q, r = a >> 3, np.uint64((a & 7) * 8)
    w = (w8[q] >> r) | ((w8[q + 1] << np.uint64(1)) << (np.uint64(63) - r))
    return w & _MASKS[min(max(b - a, 0), 8)]


@_inline
def _slot(w0, w1, length, seed, bits):
    """The home slot of a piece: a multiplicative hash (by ``seed``) of its first 16 bytes and its length."""
    x = w0 ^ (w1 * np.uint64(0xC2B2AE3D27D4EB4F)) ^ np.uint64(length)
    return np.int64((x * seed) >> np.uint64(64 - bits))


@_jit
def _fill_table(key_bytes, key_start, key_id, seed, bits, words, where, ids):
    """The keys into the table (open addressing); returns how many sit off their home slot."""
    w8 = key_bytes.view(np.uint64)
    mask, moved = ids.shape[0] - 1, 0
    ids[:] = -1
    for k in range(key_start.shape[0] - 1):
        a, b = key_start[k], key_start[k + 1]
        w0, w1 = _word(w8, a, b), _word(w8, a + 8, b)
        s = _slot(w0, w1, b - a, seed, bits)
        if ids[s] >= 0:
            moved += 1
        while ids[s] >= 0:
            s = (s + 1) & mask
        words[s, 0], words[s, 1], where[s, 0], where[s, 1], ids[s] = w0, w1, b - a, a, key_id[k]
    return moved


@_jit
def _specials(buf, size, special, pos):
    """The offsets of the bytes in ``special`` among buf[:size), into ``pos``; returns their number (branch-free:
    each byte writes the next slot, which advances on a special one)."""
    n = 0
    for i in range(size):
        pos[n] = i
        n += special[buf[i]]
    return n


@_jit
def _strippable(c):
    """Whether ``str.strip`` could remove the character starting with byte ``c`` (non-ASCII: maybe)."""
    return c >= 128 or 9 <= c <= 13 or 28 <= c <= 32


@_jit
def _tokenize_block(buf, size, eof, max_lines, pos, npos, jsonl, seed, bits, words, where, key_ids, key_bytes, unk,
                    ids, starts, ends, counts, flags, tails, unks, seen):
    """The whole lines of buf[:size) (at most ``max_lines``; the last one without a line break only at ``eof``):
    each line's [starts, ends) (without its line break), its ids appended to ``ids`` (``counts`` of them; ``seen``
    marked; ``unks``: how many are ``unk``), or ``flags = _FALLBACK``; a JSON line with fields after "text":
    ``flags = _TAIL``, ``tails`` where they start (at the comma). ``pos[:npos]``: the offsets of the `_SPECIAL`
    bytes, so the loop visits those only. Returns (lines, ids written). (The table lookup is written out once,
    not called: a call with array arguments costs more than the lookup.)"""
    w8 = buf.view(np.uint64)
    mask = key_ids.shape[0] - 1
    n, k, line, s = 0, 0, 0, 0
    pos[npos] = size  # a sentinel: the walks below stop at the buffer's end
    while line < max_lines and s < size:
        begin, flag, tail, ts = n, 0, 0, s
        if jsonl:  # {"text": "...  or {"text":"...
            if (s + 10 <= size and buf[s] == 123 and buf[s + 1] == 34 and buf[s + 2] == 116 and buf[s + 3] == 101
                    and buf[s + 4] == 120 and buf[s + 5] == 116 and buf[s + 6] == 34 and buf[s + 7] == 58):
                ts = s + 9 if buf[s + 8] == 32 else s + 8
                if buf[ts] == 34:
                    ts += 1
                else:
                    flag = 1
            else:
                flag = 1
        while pos[k] < ts:  # the specials of the JSON prefix
            k += 1
        lt, text = -1, ts  # lt: a pending "<"; text: where the current run of other text began
        if flag == 0 and (ts >= size or _strippable(buf[ts])):
            flag = 1
        while flag == 0:  # each special byte of the line: a token's end emits the text before it and the token
            p, done = pos[k], False
            if p < size and buf[p] == 60 and buf[pos[k + 1]] == 62 and pos[k + 1] < size:  # "<...>" (most)
                k += 1
                a0, b0, a1, b1 = text, p, p, pos[k] + 1
                text, lt = pos[k] + 1, -1
            elif p >= size:  # the buffer's end inside the line: the file's last line, or left for the next block
                if not eof or jsonl:  # (a JSON line without its closing quote)
                    flag = 1
                    break
                te, done = p - 1 if p > s and buf[p - 1] == 13 else p, True
            else:
                c = buf[p]
                if c == 60:
                    lt = p
                    k += 1
                    continue
                if c == 62:
                    if lt < 0:
                        k += 1
                        continue
                    a0, b0, a1, b1 = text, lt, lt, p + 1
                    text, lt = p + 1, -1
                elif c == 10:
                    if jsonl:  # no closing quote
                        flag = 1
                        break
                    te, done = p - 1 if p > s and buf[p - 1] == 13 else p, True
                elif jsonl:
                    if c != 34:  # an escape, a control character
                        flag = 1
                        break
                    te, done = p, True  # the string's end: "} or more fields
                    if not (p + 1 < size and buf[p + 1] == 125 and (p + 2 >= size or buf[p + 2] == 10 or (
                            buf[p + 2] == 13 and (p + 3 >= size or buf[p + 3] == 10)))):
                        flag, tail = 2, p + 1
                else:
                    k += 1
                    continue
            if done:
                if te <= ts or _strippable(buf[te - 1]):
                    flag = 1
                    break
                a0, b0, a1, b1 = text, te, te, te
            for j in range(2):  # the pieces [a0, b0) and [a1, b1), when not empty: their ids
                a, b = (a0, b0) if j == 0 else (a1, b1)
                if b <= a:
                    continue
                w0, w1 = _word(w8, a, b), _word(w8, a + 8, b)
                length = b - a
                slot, found = _slot(w0, w1, length, seed, bits), unk
                if words[slot, 0] == w0 and words[slot, 1] == w1 and where[slot, 0] == length and length <= 16:
                    found = key_ids[slot]  # at its home slot (every key, for a perfect seed)
                else:
                    while key_ids[slot] >= 0:
                        if words[slot, 0] == w0 and words[slot, 1] == w1 and where[slot, 0] == length:
                            same = True
                            for i in range(16, length):  # a piece longer than 16 bytes: its other bytes
                                if key_bytes[where[slot, 1] + i] != buf[a + i]:
                                    same = False
                                    break
                            if same:
                                found = key_ids[slot]
                                break
                        slot = (slot + 1) & mask
                ids[n] = found
                n += 1
            if done:
                break
            k += 1
        while pos[k] < size and buf[pos[k]] != 10:  # the line's end: the next line break (or the buffer's end)
            k += 1
        e = pos[k]
        if e >= size and not eof:  # an incomplete line: left for the next block
            n = begin
            break
        if flag == 1:
            n = begin
        else:
            u = 0
            for i in range(begin, n):
                seen[ids[i]] = True
                if ids[i] == unk:
                    u += 1
            unks[line] = u
        starts[line], ends[line], counts[line], flags[line], tails[line] = s, e, n - begin, flag, tail
        line += 1
        s, k = e + 1, k + 1
    return line, n


@_jit
def _pad_rows(ids, starts, counts, rows, out):
    """Row r of ``out``: line ``rows[r]``'s ids (``counts`` of them from ``starts``), then -100."""
    for r in range(rows.shape[0]):
        a, c = starts[rows[r]], counts[rows[r]]
        for j in range(c):
            out[r, j] = ids[a + j]
        for j in range(c, out.shape[1]):
            out[r, j] = -100


class TokenTable:
    """A vocabulary ``{token: id}`` as the compiled tokenizer's table: open addressing over each key's UTF-8 length
    and first 16 bytes (two words; a longer key's other bytes compared when those match)."""

    def __init__(self, vocab: dict[str, int], unk_id: int):
        keys = [k.encode("utf-8") for k in vocab]
        self.vocab, self.unk = vocab, unk_id
        joined = b"".join(keys)
        self.key_bytes = np.zeros((len(joined) + PAD_BYTES) // 8 * 8 + 8, np.uint8)
        self.key_bytes[:len(joined)] = np.frombuffer(joined, np.uint8)
        key_start = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int64)
        key_ids = np.array(list(vocab.values()), np.int64)
        self.bits, rng = max(4, (4 * len(keys)).bit_length()), np.random.default_rng(0)
        while True:  # a seed that puts every key at its home slot (one compare per lookup), with up to 2^18 slots
            self.words, self.where = np.zeros((1 << self.bits, 2), np.uint64), np.zeros((1 << self.bits, 2), np.int64)
            self.ids = np.full(1 << self.bits, -1, np.int64)
            for tries in range(32 if kernel.available() else 0):
                self.seed = np.uint64(rng.integers(1, 1 << 62) * 2 + 1)
                if not _fill_table(self.key_bytes, key_start, key_ids, self.seed, self.bits, self.words, self.where,
                                   self.ids):
                    break
            else:
                if kernel.available() and self.bits < 18:
                    self.bits += 1
                    continue
            break
        self.tokens = {i: t for t, i in vocab.items()}
        self.size = max(max(vocab.values(), default=0), unk_id) + 1


# ------------------------------------------------------------------------------------------------- reading lines
class InputLines:
    """The lines [first, last) of one text / JSONL file, read a block at a time: `take` gives the next ones' ids and
    tags. Keeps what the format guess needs: the ids seen and the ``<...>`` tokens outside the vocabulary."""

    def __init__(self, path: Path, table: TokenTable, first: int, last: int, offset: int):
        self.path, self.table, self.jsonl = path, table, path.suffix == ".jsonl"
        self.line, self.last, self.offset = first, last, offset  # the next line's number (0-based) and byte offset
        self.stop: Optional[int] = None  # where line ``last`` starts, read no further (None: the file's end)
        self.seen = np.zeros(table.size, bool)
        self.unknown: set[str] = set()
        self.nonblank = False
        self._buf, self._pos, self._out = np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int32)
        self._ids, self._starts, self._counts, self._tags, self._at = np.empty(0, np.int32), np.zeros(1, np.int64), \
            np.empty(0, np.int64), [], 0

    def seek(self, first: int, last: int, offset: int, stop: Optional[int] = None) -> None:
        """Go on with lines [first, last), from byte ``offset`` to ``stop`` (what was read but not taken is dropped;
        what the format guess needs is kept)."""
        self.line, self.last, self.offset, self.stop = first, last, offset, stop
        self._counts, self._at = np.empty(0, np.int64), 0

    def __len__(self) -> int:
        """Lines read but not yet taken."""
        return len(self._counts) - self._at

    def counts(self) -> np.ndarray:
        """The token counts of the lines read but not taken (reads a block when there are none)."""
        if not len(self) and self.line < self.last:
            self._read_block()
        return self._counts[self._at:]

    def take(self, k: int) -> tuple[np.ndarray, np.ndarray, list[Optional[str]]]:
        """The next ``k`` lines: their ids (concatenated), token counts and tags (None: untagged)."""
        ids, counts, tags = [], [], []
        while k:
            if not len(self):
                self._read_block()
            n = min(k, len(self))
            ids.append(self._ids[self._starts[self._at]:self._starts[self._at + n]])
            counts.append(self._counts[self._at:self._at + n])
            tags += self._tags[self._at:self._at + n]
            self._at, k = self._at + n, k - n
        if len(ids) == 1:
            return ids[0], counts[0], tags
        return (np.concatenate(ids) if ids else np.empty(0, np.int32),
                np.concatenate(counts) if counts else np.empty(0, np.int64), tags)

    def _read(self, size: int) -> tuple[int, bool]:
        """Bytes from ``self.offset`` into the block buffer, up to ``size`` and ``self.stop``: (how many, whether the
        file or the lines ended)."""
        if self.stop is not None:
            size = min(size, self.stop - self.offset)
        if len(self._buf) < size + PAD_BYTES:
            self._buf = np.empty((size + PAD_BYTES) // 8 * 8 + 8, np.uint8)
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            got = f.readinto(memoryview(self._buf)[:size])
        return got, got < size or (self.stop is not None and self.offset + got >= self.stop)

    def _read_block(self) -> None:
        """Read and tokenize the next block of whole lines (at least one, at most those left in the range)."""
        want, size = self.last - self.line, BLOCK_BYTES
        while True:
            got, eof = self._read(size)
            buf = self._buf
            if kernel.available():
                if len(self._pos) < got + 1:  # (offsets in 32 bits below 2 GB: less memory to write and read)
                    self._pos = np.empty(got + 1, np.int32 if got < 1 << 31 else np.int64)
                    self._out = np.empty(got + 1, np.int32)
                m = max(min(want, got + 1), 1)
                starts, ends, counts, flags, tails, unks = (np.zeros(m, np.int64) for _ in range(6))
                npos = _specials(buf, got, _SPECIAL, self._pos)
                lines, n = _tokenize_block(buf, got, eof, want, self._pos, npos, self.jsonl, self.table.seed,
                                           self.table.bits,
                                           self.table.words, self.table.where, self.table.ids, self.table.key_bytes,
                                           self.table.unk, self._out, starts, ends, counts, flags, tails, unks,
                                           self.seen)
            else:  # no numba (or NUMBA_DISABLE_JIT): every line the readable way
                ends = np.flatnonzero(buf[:got] == 10)
                if eof and got and (not len(ends) or ends[-1] != got - 1):  # the last line, without a line break
                    ends = np.append(ends, got)
                ends = ends[:want]
                lines, n = len(ends), 0
                starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
                counts, tails, unks = (np.zeros(lines, np.int64) for _ in range(3))
                flags = np.full(lines, _FALLBACK, np.int64)
            if lines or eof:
                break
            size *= 2  # a line longer than the block
        if not lines:  # the file shrank since its line index (a writer still at it)
            raise InputError(f"{self.path}: fewer lines than counted a moment before: it changed while being read "
                             "(is something still writing it?); evaluate it once it is complete")
        starts, ends, counts, flags, tails, unks = (a[:lines] for a in (starts, ends, counts, flags, tails, unks))
        used = min(int(ends[-1]) + 1, got)
        data = bytes(memoryview(buf)[:used])
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"{self.path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                             f"{self.offset + err.start}); expected one token sequence per line, or an OWA .mcap "
                             "recording") from None
        ids = self._out[:n]
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
        self.nonblank = self.nonblank or bool((flags != _FALLBACK).any())  # a compiled line holds text
        if rows:  # the readable path's ids in place of the compiled pass's (none: it left those lines)
            pieces = np.split(ids, np.cumsum(counts)[:-1])
            for line, row in rows:
                pieces[line], counts[line] = row, len(row)
                self.seen[row] = True
            ids = np.concatenate(pieces).astype(np.int32)
        else:
            ids = ids.copy()  # the buffer is reused by the next block
        self._ids, self._counts = ids, counts
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._tags = [None] * len(counts)
        for line, tag in tags:
            self._tags[line] = tag
        self._at = 0
        self.line += lines
        self.offset += used

    def _tail(self, data: bytes, tail: int, e: int, number: int):
        """The tag of a plain JSON line with more fields after "text" (`_FALLBACK`: read it the readable way)."""
        rest = data[tail:e].rstrip(b"\r")
        try:
            fields = json.loads(b"{" + rest[1:]) if rest[:1] == b"," else None
        except (ValueError, RecursionError):  # (the readable path says what is wrong with it)
            fields = None
        if not isinstance(fields, dict) or not fields or "text" in fields:
            return _FALLBACK
        tag = fields.get("tag")
        if tag is not None:
            _check_tag(tag, self.path, number)
        return tag

    def _readable(self, raw: bytes, number: int) -> tuple[np.ndarray, Optional[str]]:
        """One line the way `evaluate.read_tagged` and `tokenize` read it."""
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
        """Every ``<...>`` token of the lines read (as `evaluate.guess_format` collects them)."""
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
    except RecursionError:
        raise InputError(f"{path}:{number}: JSON nested too deep to read (expected a string or an object with a "
                         "'text' field)") from None
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


def raise_first(error: Optional[BaseException], at: int = 0) -> None:
    """Every rank raises the error found first in the files' order, or none: no rank is left waiting in a collective.
    ``at``: where this rank found it (e.g. its chunk's first line); equal ones go to the lower rank (the ranks'
    shares of a file's blocks follow its order)."""
    errors = [(where, e) for where, e in exchange((at, error)) if e is not None]
    if errors:
        raise min(errors, key=lambda item: item[0])[1]


SCAN_BYTES = 4 << 20
PIECE_BYTES = 64 << 10  # the line index's resolution (a block's pieces: `LineIndex.offset_of` reads one)


def _piece() -> int:
    return min(PIECE_BYTES, SCAN_BYTES)


def scan_blocks(path: Path, blocks: range) -> list[tuple[list[int], dict[str, int]]]:
    """For each block ``b`` of `SCAN_BYTES` bytes of the file: the line breaks in each of its pieces of `PIECE_BYTES`
    (the last one shorter), and the tag names of the JSONL lines that start in it, each with its first line there
    (the line breaks in the block before that line). Only the lines that may hold a tag (a ``"tag"`` key, or an
    escape) are parsed; a line that does not parse is left to the reading pass, which says what is wrong with it."""
    out = []
    with open(path, "rb") as f:
        for b in blocks:
            head = 1 if b > 0 else 0  # the byte before the block: whether a line starts at its start
            f.seek(b * SCAN_BYTES - head)
            data = f.read(SCAN_BYTES + head)
            end, names = min(head + SCAN_BYTES, len(data)), {}
            if path.suffix == ".jsonl":
                rest = f.readline() if data and not data.endswith(b"\n") else b""  # the block's last line, whole
                if _may_tag(data) or _may_tag(data[-8:] + rest):
                    data += rest
                    first, number = head, 0  # the first line starting in the block, and its number there
                    if head and data[0] != 10:  # (none when the block holds no line break)
                        first, number = (data.find(b"\n", head) + 1) or end, 1
                    _tags_of(data, first, end, number, names)
            breaks = np.flatnonzero(np.frombuffer(data, np.uint8)[head:end] == 10)
            out.append((np.bincount(breaks // _piece(), minlength=-(-(end - head) // _piece())).tolist(), names))
    return out


def _may_tag(data: bytes) -> bool:
    """Whether ``data`` holds ``"tag"`` or a backslash: a ``"`` followed by ``tag"`` among its (few) quotes, in numpy
    (``bytes.find`` of ``"tag"`` runs at ~1.5 GB/s on token text, whose digits defeat its skip table)."""
    if b"\\" in data:
        return True
    a = np.frombuffer(data, np.uint8)
    at = np.flatnonzero(a[:max(len(a) - 4, 0)] == 34)
    for k, c in enumerate(b'tag"', 1):
        at = at[a[at + k] == c]
    return len(at) > 0


def _tags_of(data: bytes, at: int, end: int, number: int, names: dict[str, int]) -> None:
    """The tag names of the lines of ``data`` that start in [at, end) (the first one numbered ``number``)."""
    while at < end:
        stop = data.find(b"\n", at)
        stop = len(data) if stop < 0 else stop
        line = data[at:stop]
        if b'"tag"' in line or b"\\" in line:
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):  # (the reading pass says what is wrong with it)
                item = None
            tag = item.get("tag") if isinstance(item, dict) else None
            if is_tag_name(tag):
                names.setdefault(tag, number)
        number, at = number + 1, stop + 1


class LineIndex:
    """Where a file's lines start, from the line breaks in each piece of its blocks (`scan_blocks`: every rank scans
    a share of the blocks, `exchange` gives every rank all of them): ``lines`` (a final line without a line break
    counts; a file ending in one has no empty last line) and `offset_of`."""

    def __init__(self, path: Path, size: int, pieces: list[int], ends_in_break: bool):
        self.path, self.size = path, size
        self.before = np.concatenate([[0], np.cumsum(pieces, dtype=np.int64)])  # line breaks before each piece
        per = -(-SCAN_BYTES // _piece())  # pieces of a block (its last one shorter)
        k = np.arange(len(pieces))
        self.starts = np.append(k // per * SCAN_BYTES + k % per * _piece(), size)  # each piece's first byte
        self.lines = int(self.before[-1]) + (size > 0 and not ends_in_break)

    def offset_of(self, line: int) -> int:
        """Where line ``line`` (0-based) starts."""
        if line == 0:
            return 0
        k = int(np.searchsorted(self.before, line, side="left")) - 1  # the piece holding the line break before it
        start = int(self.starts[k])
        with open(self.path, "rb") as f:
            f.seek(start)
            piece = np.frombuffer(f.read(int(self.starts[k + 1]) - start), np.uint8)
        return start + int(np.flatnonzero(piece == 10)[line - int(self.before[k]) - 1]) + 1


CHUNK_SHARE, MIN_CHUNK_PIECES = 4, 16  # a chunk: 1 / (4 world) of what is left, at least 16 pieces (1 MB)


def chunks(target: LineIndex, world: int) -> list[tuple[int, int]]:
    """The target file's lines as chunks [first, last) for the ranks to claim (`Claims`), in order, cut at the lines
    that hold a piece's first byte: each chunk ``max(MIN_CHUNK_PIECES, ceil(left / (CHUNK_SHARE world)))`` of the
    ``left`` pieces not yet cut (guided self-scheduling: large chunks first, small ones last, so the ranks end
    within a small chunk of each other); none empty."""
    pieces, cuts, k = len(target.before) - 1, [], 0
    while k < pieces:
        cuts.append(int(target.before[k]))
        k += max(MIN_CHUNK_PIECES, -(-(pieces - k) // (CHUNK_SHARE * world)))
    bounds = sorted(set(cuts) | {target.lines})
    return list(zip(bounds[:-1], bounds[1:]))


class Claims:
    """The chunks (of ``count``, numbered in the files' order) this rank takes, in increasing order. Each rank claims
    the next unclaimed one from a counter in torch.distributed's store when it is done with the one before, so a
    slower process or node takes fewer: the store torchrun (or ``init_process_group``'s ``env://``) serves at
    ``MASTER_ADDR:MASTER_PORT``. Where a rank cannot reach it, chunk ``k`` goes to rank ``k % world``. Call on every
    rank (one collective)."""

    def __init__(self, count: int):
        self.count, (self.rank, self.world) = count, rank_world()
        self.store = self.key = None
        if self.world > 1:
            agreed = exchange((_store() is not None, uuid.uuid4().hex))
            if all(reached for reached, _ in agreed):
                self.store, self.key = _store(), f"owa_metrics/claims/{agreed[0][1]}"

    def __iter__(self):
        if self.store is None:
            yield from range(self.rank, self.count, self.world)
            return
        while (k := self.store.add(self.key, 1) - 1) < self.count:
            yield k


_CLIENTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # the default process group -> its clients


def _store() -> Optional[torch.distributed.Store]:
    """A client of the store at ``MASTER_ADDR:MASTER_PORT`` (None when unset or unreachable), made once per process
    group: a group set up later on the same address (a notebook, a sweep) has a new store there, and the earlier
    group's client would talk to the dead one. Call under an initialized process group."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not (host and port.isdigit()):
        return None
    clients = _CLIENTS.setdefault(torch.distributed.group.WORLD, {})
    if (host, port) not in clients:
        clients[host, port] = _client(host, int(port))
    return clients[host, port]


def _client(host: str, port: int) -> Optional[torch.distributed.Store]:
    try:
        return torch.distributed.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=30))
    except RuntimeError:  # (DistStoreError, DistNetworkError: no store there)
        return None


def line_indexes(paths) -> tuple[list[LineIndex], list[dict[str, int]]]:
    """Each file's `LineIndex` and tags (``{name: first line}``), every rank scanning an equal share of each file's
    blocks (one collective: call on every rank); raises `InputError` naming a file that cannot be read or holds no
    line, on every rank alike."""
    rank, world = rank_world()
    error, mine, sizes = None, [], []
    try:
        for path in paths:
            try:
                size = path.stat().st_size
                with open(path, "rb") as f:
                    f.seek(max(size - 1, 0))
                    last = f.read(1)
                count = -(-size // SCAN_BYTES)
                mine.append(scan_blocks(path, range(count * rank // world, count * (rank + 1) // world)))
            except OSError as err:
                raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
            if size == 0:
                raise InputError(f"{path}: no sequences (the file is empty or blank)")
            sizes.append((size, last == b"\n"))
    except InputError as err:
        error = err
    raise_first(error)
    parts = exchange(mine)  # [rank][file][block]
    indexes, tags = [], []
    for k, (path, (size, ends_in_break)) in enumerate(zip(paths, sizes)):
        blocks = [block for part in parts for block in part[k]]
        index = LineIndex(path, size, [count for counts, _ in blocks for count in counts], ends_in_break)
        found: dict[str, int] = {}
        before = np.cumsum([0] + [sum(counts) for counts, _ in blocks])  # line breaks before each block
        for b, (_, names) in enumerate(blocks):
            for name, line in names.items():
                found[name] = min(found.get(name, line + int(before[b])), line + int(before[b]))
        indexes.append(index)
        tags.append(found)
    return indexes, tags


# ------------------------------------------------------------------------------------------------------ evaluate
def check_whole(path: Path, index: LineIndex) -> None:
    """Read every line of a file (any format's tokens): raises `InputError` saying what is wrong with it."""
    from ..tokens.vocab import build_tokenizer

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


def row_tags(paths, file_tags, tagged: tuple, line: int) -> Optional[list[str]]:
    """Each line's tag (lines from ``line``, 0-based): from the files with tags (``tagged``), which must then tag every
    line and agree; None when no file has tags."""
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


def window(readers: list[InputLines], left: int) -> list[tuple[np.ndarray, np.ndarray, list[Optional[str]]]]:
    """The next lines of both files (ids, counts, tags each; at most ``left``): the rest of the target's block, and
    its next blocks while they hold fewer than `WINDOW_TOKENS` target tokens (and 16 x `MAX_LINES` lines)."""
    parts, tokens, taken = [], 0, 0
    while taken < left and tokens < WINDOW_TOKENS and taken < 16 * MAX_LINES:
        counts = readers[1].counts()
        k = max(1, min(len(counts), left - taken))
        parts.append([reader.take(k) for reader in readers])
        tokens, taken = tokens + int(counts[:k].sum()), taken + k
    if len(parts) == 1:
        return parts[0]
    return [(np.concatenate([p[side][0] for p in parts]), np.concatenate([p[side][1] for p in parts]),
             [tag for p in parts for tag in p[side][2]]) for side in range(2)]


def batches(pred_counts: np.ndarray, target_counts: np.ndarray) -> list[np.ndarray]:
    """A window of lines in batches for `update` (their indices): sorted by length, so that each batch's rows are
    alike (little padding: every op of an update runs over [rows, the longest row]), cut into batches of about
    `TARGET_TOKENS` target tokens and at most `MAX_LINES` lines. The report does not depend on the order of the
    sequences (sums, and samples read sorted)."""
    order = np.argsort(np.maximum(pred_counts, target_counts), kind="stable")
    total = int(target_counts.sum())
    parts = max(-(-total // TARGET_TOKENS), -(-len(order) // MAX_LINES), 1)
    cuts = np.searchsorted(np.cumsum(target_counts[order]), total * np.arange(1, parts) / parts, side="right")
    return [rows for rows in np.split(order, cuts) if len(rows)]


def padded(ids: np.ndarray, counts: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """[len(rows), max(count, 1)]: the ids of lines ``rows`` (``ids``: every line's, concatenated), each then -100."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    out = np.empty((len(rows), max(int(counts[rows].max(initial=0)), 1)), np.int64)
    if kernel.available():
        _pad_rows(ids, starts, counts, rows, out)
    else:
        out.fill(-100)
        for r, line in enumerate(rows.tolist()):
            out[r, :counts[line]] = ids[starts[line]:starts[line] + counts[line]]
    return torch.from_numpy(out)
