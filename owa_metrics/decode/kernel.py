"""The CPU kernel of `decode_batch`: one compiled pass over each row's tokens, driven by the format's table.

For CPU tensors `decode_batch` runs this (numba ``njit``, ``cache=True``, ``nogil=True``) instead of the torch
ops: it finds the spans, checks each event slot by slot against its layout's rules and reads the fields with
the layout's place values, signs and moduli — the same tables (`_Tables`) and the same rules as the torch
path, which stays the reference for the GPU and the definition the tests hold this kernel to. The first call
in a fresh environment compiles (about 11 s, and one logged line says so); later processes load numba's cache in
about 1 s. Without numba (or when it fails to load, or under ``NUMBA_DISABLE_JIT=1``) the torch path runs, with
one warning; where numba cannot write its cache the kernels compile uncached in each process, with one warning.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from ..schema import IMAGE_BIT, ROLE_MASK, SKIP_BIT, STRUCT_BIT, VALUE_SHIFT, Category, Kind, Role, Status

try:
    from numba import njit
except Exception as err:  # noqa: BLE001 - any failure to load means: use the torch path
    njit, IMPORT_ERROR = None, err
else:
    IMPORT_ERROR = None

# the schema's codes as plain ints: numba compiles them in as constants (`compiled_codes` says which it holds)
START, END, KEYBOARD, SCREEN, IMAGE, IGNORED = map(int, (Role.START, Role.END, Role.KEYBOARD, Role.SCREEN, Role.IMAGE,
                                                        Role.IGNORED))
VALID, INVALID_FORMAT, MISSING_FIELDS, TRUNCATED, TYPE_MISMATCH, MISSING, INVALID_TARGET = map(int, (
    Status.VALID, Status.INVALID_FORMAT, Status.MISSING_FIELDS, Status.TRUNCATED, Status.TYPE_MISMATCH, Status.MISSING,
    Status.INVALID_TARGET))
MOUSE_KIND, SCREEN_KIND = int(Kind.MOUSE), int(Kind.SCREEN)
KEYBOARD_CAT, MOUSE_OP_CAT, MOUSE_NOP_CAT, SCREEN_CAT, INVALID_CAT = map(int, (
    Category.KEYBOARD, Category.MOUSE_OP, Category.MOUSE_NOP, Category.SCREEN, Category.INVALID))
CODE_NAMES = ("ROLE_MASK", "STRUCT_BIT", "SKIP_BIT", "IMAGE_BIT", "VALUE_SHIFT", "START", "END", "KEYBOARD", "SCREEN",
              "IMAGE", "IGNORED", "VALID", "INVALID_FORMAT", "MISSING_FIELDS", "TRUNCATED", "TYPE_MISMATCH", "MISSING",
              "INVALID_TARGET", "MOUSE_KIND", "SCREEN_KIND", "KEYBOARD_CAT", "MOUSE_OP_CAT", "MOUSE_NOP_CAT",
              "SCREEN_CAT", "INVALID_CAT")

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"owa_metrics: {message}", RuntimeWarning, stacklevel=4)


def _jit_disabled() -> bool:
    from numba import config

    return bool(config.DISABLE_JIT)


def available() -> bool:
    """Whether the compiled kernel can run; warns once when it cannot (numba missing, or ``NUMBA_DISABLE_JIT=1``,
    under which the kernels would run as Python loops, ~30x slower than the torch path)."""
    if njit is None:
        _warn_once("import", f"numba is not available ({IMPORT_ERROR}); decoding on the CPU uses the slower torch "
                             "path. pip install numba to get the compiled kernel.")
        return False
    if _jit_disabled():
        _warn_once("disabled", "NUMBA_DISABLE_JIT is set: the numba kernels would run as Python loops, so the CPU "
                               "uses the torch path instead. Unset NUMBA_DISABLE_JIT to get the compiled kernel.")
        return False
    return True


COMPILING = ("owa_metrics: numba compiles the CPU kernels, once per install (about 11 s, 5 s more at the first "
             "comparable events); later runs load them from numba's cache")


if njit is not None:
    from numba.core import event as _event

    class _FirstCompile(_event.Listener):
        """numba's ``numba:compile`` event (a compile, not a cache load): `COMPILING`, logged (a warning, so that
        Python's default handler prints it on stderr, one line) at the first compile of one of this package's
        kernels in this process."""

        said = False

        def on_start(self, event) -> None:
            fn = getattr(event.data.get("dispatcher"), "py_func", None)  # any numba compile comes here: read softly
            if not self.said and (getattr(fn, "__module__", None) or "").startswith("owa_metrics."):
                self.said = True
                logging.getLogger("owa_metrics").warning(COMPILING)

        def on_end(self, event) -> None:
            pass

    _event.register("numba:compile", _FirstCompile())


def _jit(fn):
    """``njit(cache=True, nogil=True)``; where numba has nowhere to write its cache (a read-only install with no
    writable ``NUMBA_CACHE_DIR`` or HOME), the same jit uncached: each process then compiles on first use (a few
    seconds), with one warning."""
    if njit is None:
        return fn
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError as err:  # numba: "cannot cache function ...: no locator available"
        _warn_once("cache", f"numba cannot cache the CPU kernels ({err}); they compile in each process on first use "
                            "(a few seconds). Set NUMBA_CACHE_DIR to a directory only you can write to.")
        return njit(nogil=True)(fn)


@_jit
def compiled_codes():
    """`CODE_NAMES`' values as the compiled (possibly cached) kernels of this module hold them."""
    return (ROLE_MASK, STRUCT_BIT, SKIP_BIT, IMAGE_BIT, VALUE_SHIFT, START, END, KEYBOARD, SCREEN, IMAGE, IGNORED, VALID,
            INVALID_FORMAT, MISSING_FIELDS, TRUNCATED, TYPE_MISMATCH, MISSING, INVALID_TARGET, MOUSE_KIND, SCREEN_KIND,
            KEYBOARD_CAT, MOUSE_OP_CAT, MOUSE_NOP_CAT, SCREEN_CAT, INVALID_CAT)


@_jit
def _codes(ids, table, mask_by, out):
    """``VocabMap.codes``: the packed code of each id (``table[clamp(id, -1, size) + 1]``); where ``mask_by``
    (the target ids under teacher forcing, else empty) is negative, the code of an ignored label."""
    size = table.shape[0] - 2
    masked = mask_by.shape[0] == ids.shape[0]
    for k in range(ids.shape[0]):
        i = -1 if masked and mask_by[k] < 0 else min(max(ids[k], -1), size)
        out[k] = table[i + 1]


@_jit
def _spans(code, B, T, seq, first, last, cut, counts):
    """Every event span of every row (see `EventCodec.spans`); returns how many. Positions are row-relative."""
    n = 0
    for b in range(B):
        row = b * T
        start, segment = -1, 0
        for t in range(T):
            c = code[row + t]
            if c & STRUCT_BIT == 0:
                continue
            if c & ROLE_MASK == START:
                if start >= 0:
                    seq[n], first[n], last[n], cut[n] = b, start, t - 1, False
                    n += 1
                start = t
            else:
                if start >= 0:
                    seq[n], first[n], last[n], cut[n] = b, start, t, False
                else:  # an end without a start: the span starts at the first kept token after the previous end
                    f = segment
                    while code[row + f] & SKIP_BIT:
                        f += 1
                    seq[n], first[n], last[n], cut[n] = b, f, t, True
                n += 1
                start, segment = -1, t + 1
        if start >= 0:  # cut by the row's end: trailing ignored / episode tokens are padding
            e = T - 1
            while e >= 0 and code[row + e] & SKIP_BIT:
                e -= 1
            seq[n], first[n], last[n], cut[n] = b, start, e, False
            n += 1
    for i in range(n):
        counts[seq[i]] += 1
    return n


@_jit
def _decode(code, T, seq, first, last, cut, n, rules, length, run_start, kind_layout, var_base, var_longer, var_at,
            var_role, place, sign, modulus, digit_slots, digit_sign, digit_field, unit_ns, scroll_unit, status, kind,
            values, digits):
    """Check and read the ``n`` spans of one side, as `_decode_side` does (same rules, same precedence)."""
    width = rules.shape[1]
    n_fields = place.shape[1]
    # each (layout, field)'s slots with a place value, with a sign: the sums below visit those only
    place_at, sign_at = np.zeros(place.shape, np.int64), np.zeros(sign.shape, np.int64)
    n_place, n_sign = np.zeros(place.shape[:2], np.int64), np.zeros(sign.shape[:2], np.int64)
    for lay in range(place.shape[0]):
        for f in range(n_fields):
            for j in range(width):
                if place[lay, f, j] != 0:
                    place_at[lay, f, n_place[lay, f]] = j
                    n_place[lay, f] += 1
                if sign[lay, f, j] != 0:
                    sign_at[lay, f, n_sign[lay, f]] = j
                    n_sign[lay, f] += 1
    r = np.zeros(width, np.int64)
    v = np.zeros(width, np.int64)
    number = np.zeros(n_fields, np.int64)
    magnitude = np.zeros(n_fields, np.int64)
    for i in range(n):
        row = seq[i] * T
        slot0 = first[i] - (1 if cut[i] else 0)
        span_len = last[i] - slot0 + 1
        for j in range(width):
            pos = slot0 + j
            c = code[row + pos] if 0 <= pos < T else 0
            r[j] = c & ROLE_MASK
            v[j] = (c >> VALUE_SHIFT) - 1
        k = r[1] - KEYBOARD if span_len > 1 and KEYBOARD <= r[1] <= SCREEN else -1
        lay = kind_layout[max(k, 0)]
        for x in range(var_base.shape[0]):
            at = min(var_at[x], width - 1)
            if lay == var_base[x] and span_len > var_at[x] and r[at] == var_role[x]:
                lay = var_longer[x]
        bad = width
        for j in range(min(span_len, width)):
            rule = rules[lay, j]
            accepted = ((rule >> r[j]) & 1) == 1 and v[j] < (rule >> 16)
            if j == 0 and cut[i]:
                accepted = True
            if not accepted:
                bad = j
                break
        if bad < length[lay]:
            role = r[min(bad, width - 1)]
            s = MISSING_FIELDS if role == END or role == IGNORED else INVALID_FORMAT
        else:
            s = TRUNCATED if span_len < length[lay] else VALID
        if run_start[lay] >= 0:
            if s == VALID:  # image tokens (or ignored labels) closed by <EVENT_END> at the span's last token
                others = 0
                for pos in range(slot0 + run_start[lay], last[i] + 1):
                    others += (code[row + pos] & IMAGE_BIT) == 0
                data = r[min(run_start[lay], width - 1)]
                if others <= 0:
                    s = TRUNCATED
                elif data != IMAGE and data != IGNORED:
                    s = MISSING_FIELDS if data == END else INVALID_FORMAT
                elif not (others == 1 and code[row + last[i]] & ROLE_MASK == END):
                    s = INVALID_FORMAT
        elif s == VALID and length[lay] < span_len:
            s = INVALID_FORMAT
        status[i], kind[i] = s, k
        if s != VALID:
            values[i, 0] = INVALID_CAT
            for f in range(1, values.shape[1]):
                values[i, f] = 0
            for d in range(digit_slots.shape[1]):
                digits[i, d] = -1
            continue
        for f in range(n_fields):  # (-1)^minus * sum(value * place), then the modulus
            total, minus = 0, 0
            for q in range(n_place[lay, f]):
                j = place_at[lay, f, q]
                total += v[j] * place[lay, f, j]
            for q in range(n_sign[lay, f]):
                minus += v[sign_at[lay, f, q]]
            magnitude[f] = total
            value = -total if minus == 1 else total
            m = modulus[lay, f]
            number[f] = value - m if m > 0 and value >= m // 2 else value
        flags = number[5]
        if k == MOUSE_KIND:
            category = MOUSE_OP_CAT if flags != 0 else MOUSE_NOP_CAT
        else:
            category = SCREEN_CAT if k == SCREEN_KIND else KEYBOARD_CAT
        values[i, 0], values[i, 1], values[i, 2], values[i, 3] = category, number[0] * unit_ns, number[1], number[2]
        values[i, 4], values[i, 5], values[i, 6], values[i, 7] = number[3], number[4], flags, number[6] * scroll_unit
        for d in range(digit_slots.shape[1]):
            slot = digit_slots[lay, d]
            if slot < 0:
                digits[i, d] = -1
            elif digit_sign[lay, d] and magnitude[digit_field[d]] == 0:
                digits[i, d] = 0  # <SIGN_MINUS><0>... is the number 0: its sign level reads as +
            else:
                digits[i, d] = v[slot]


@_jit
def _pair(t_seq, n, p_counts, B, p_status, p_kind, p_values, p_digits, p_first, p_last, p_cut,
          status, kind, values, digits, start, end, start_cut):
    """Generation: the k-th target event of a row takes the k-th predicted event of that row, else `missing`."""
    offset = np.zeros(B + 1, np.int64)
    for b in range(B):
        offset[b + 1] = offset[b] + p_counts[b]
    rank, previous = 0, -1
    for i in range(n):
        b = t_seq[i]
        rank = rank + 1 if b == previous else 0
        previous = b
        if rank < p_counts[b]:
            p = offset[b] + rank
            status[i], kind[i], start[i], end[i], start_cut[i] = p_status[p], p_kind[p], p_first[p], p_last[p], p_cut[p]
            values[i] = p_values[p]
            digits[i] = p_digits[p]
        else:
            status[i], kind[i], start[i], end[i], start_cut[i] = MISSING, -1, -1, -1, False
            values[i, 0] = INVALID_CAT
            values[i, 1:] = 0
            digits[i] = -1


@_jit
def _compare(t_status, t_kind, p_status, p_kind, generation, out):
    """The comparison status of each pair (see `decode_batch`)."""
    for i in range(t_status.shape[0]):
        decided = p_status[i] == VALID if generation else p_kind[i] >= 0
        if t_status[i] != VALID:
            out[i] = INVALID_TARGET
        elif decided and p_kind[i] != t_kind[i]:
            out[i] = TYPE_MISMATCH
        else:
            out[i] = p_status[i]


def codes(ids: np.ndarray, table: np.ndarray, mask_by=None) -> np.ndarray:
    """Packed codes [B, T] (int32) of token ids [B, T] (int64) read from ``VocabMap.codes_table``; with
    ``mask_by`` (ids of the same shape) positions where it is negative read as ignored labels."""
    out = np.empty(ids.shape, np.int32)
    empty = np.empty(0, np.int64)
    _codes(ids.reshape(-1), table, empty if mask_by is None else mask_by.reshape(-1), out.reshape(-1))
    return out


def decode_arrays(t_code: np.ndarray, p_code: np.ndarray, tables, generation: bool) -> dict:
    """``decode_batch``'s outputs as numpy arrays, from both sides' packed codes [B, T] / [B, T'] (int32)."""
    B, T = t_code.shape
    t_seq, t_first, t_last, t_cut, t_counts, n = _side_spans(t_code)
    target = _side(t_code.reshape(-1), T, t_seq, t_first, t_last, t_cut, n, tables)
    if not generation:
        pred = _side(p_code.reshape(-1), T, t_seq, t_first, t_last, t_cut, n, tables)
        pred.update(start=t_first, end=t_last, start_cut=t_cut)
        p_counts = t_counts
    else:
        p_seq, p_first, p_last, p_cut, p_counts, m = _side_spans(p_code)
        generated = _side(p_code.reshape(-1), p_code.shape[1], p_seq, p_first, p_last, p_cut, m, tables)
        pred = _empty(n, tables)
        _pair(t_seq, n, p_counts, B, generated["status"], generated["kind"], generated["values"], generated["digits"],
              p_first, p_last, p_cut, pred["status"], pred["kind"], pred["values"], pred["digits"], pred["start"],
              pred["end"], pred["start_cut"])
    target.update(start=t_first, end=t_last, start_cut=t_cut)
    status = np.empty(n, np.int64)
    _compare(target["status"], target["kind"], pred["status"], pred["kind"], generation, status)
    out = {"seq": t_seq, "status": status, "target": target, "pred": pred, "target_count": t_counts,
           "pred_count": p_counts}
    if generation:  # every generated event, as decoded on its own
        out.update(generated={**generated, "start": p_first, "end": p_last, "start_cut": p_cut}, generated_seq=p_seq)
    return out


def _side_spans(code: np.ndarray):
    B, T = code.shape
    bound = int(np.count_nonzero(code & STRUCT_BIT))
    seq, first, last = (np.empty(bound, np.int64) for _ in range(3))
    cut, counts = np.empty(bound, np.bool_), np.zeros(B, np.int64)
    n = _spans(code.reshape(-1), B, T, seq, first, last, cut, counts)
    return seq[:n], first[:n], last[:n], cut[:n], counts, n


def _empty(n: int, tables) -> dict:
    return {"status": np.empty(n, np.int64), "kind": np.empty(n, np.int32), "values": np.empty((n, 8), np.int64),
            "digits": np.empty((n, tables.digit_slots.shape[1]), np.int32), "start": np.empty(n, np.int64),
            "end": np.empty(n, np.int64), "start_cut": np.empty(n, np.bool_)}


def _side(code, T, seq, first, last, cut, n, tables) -> dict:
    out = _empty(n, tables)
    a = tables.arrays
    _decode(code, T, seq, first, last, cut, n, a["rules"], a["length"], a["run_start"], a["kind_layout"], a["var_base"],
            a["var_longer"], a["var_at"], a["var_role"], a["place"], a["sign"], a["modulus"], a["digit_slots"],
            a["digit_sign"], a["digit_field"], tables.unit_ns, tables.scroll_unit, out["status"], out["kind"], out["values"], out["digits"])
    return out
