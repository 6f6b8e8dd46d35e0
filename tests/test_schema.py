"""One schema: every module reads the codes of `owa_metrics.schema`, and the compiled kernels hold the same values
(numba compiles module constants in and its cache does not see a change in another file)."""

import pytest

from owa_metrics import schema
from owa_metrics.decode import kernel as decode_kernel
from owa_metrics.functional import kernel as accumulate_kernel
from owa_metrics.schema import Category, Kind, Role, Status

# each kernel constant's name -> the schema code it stands for (written out here, not read from the kernels)
MEANING = {
    "ROLE_MASK": schema.ROLE_MASK, "STRUCT_BIT": schema.STRUCT_BIT, "SKIP_BIT": schema.SKIP_BIT,
    "IMAGE_BIT": schema.IMAGE_BIT, "VALUE_SHIFT": schema.VALUE_SHIFT,
    "START": Role.START, "END": Role.END, "KEYBOARD": Role.KEYBOARD, "SCREEN": Role.SCREEN, "IMAGE": Role.IMAGE,
    "IGNORED": Role.IGNORED,
    "VALID": Status.VALID, "INVALID_FORMAT": Status.INVALID_FORMAT, "MISSING_FIELDS": Status.MISSING_FIELDS,
    "TRUNCATED": Status.TRUNCATED, "TYPE_MISMATCH": Status.TYPE_MISMATCH, "MISSING": Status.MISSING,
    "INVALID_TARGET": Status.INVALID_TARGET,
    "MOUSE_KIND": Kind.MOUSE, "SCREEN_KIND": Kind.SCREEN,
    "KEYBOARD_CAT": Category.KEYBOARD, "MOUSE_OP_CAT": Category.MOUSE_OP, "MOUSE_NOP_CAT": Category.MOUSE_NOP,
    "SCREEN_CAT": Category.SCREEN, "INVALID_CAT": Category.INVALID, "N_CAT": len(schema.CATEGORY_NAMES),
}


@pytest.mark.parametrize("module", [decode_kernel, accumulate_kernel], ids=["decode", "accumulate"])
def test_compiled_kernels_hold_the_schema_codes(module):
    if not decode_kernel.available():
        pytest.skip("numba is not available: no compiled kernel to check")
    compiled = dict(zip(module.CODE_NAMES, module.compiled_codes()))
    assert set(compiled) <= set(MEANING)
    assert compiled == {name: int(MEANING[name]) for name in compiled}
    assert {name: getattr(module, name) for name in module.CODE_NAMES} == compiled  # the Python side too


def test_the_relations_the_decoders_rely_on():
    # kind = type role - KEYBOARD, in Kind order (both decoders read a type token's kind so)
    assert [schema.TYPE_ROLES[k.name.lower()] - Role.KEYBOARD for k in Kind] == [0, 1, 2]
    # a mouse event's category: KIND_CATEGORY[mouse] (mouse_nop) minus 1 when its button flags are set
    assert schema.KIND_CATEGORY == (Category.KEYBOARD, Category.MOUSE_NOP, Category.SCREEN)
    assert Category.MOUSE_NOP - 1 == Category.MOUSE_OP
    # the packed code: roles fit the mask, the three flags are distinct bits between the mask and the value
    assert max(Role) <= schema.ROLE_MASK
    bits = [schema.STRUCT_BIT, schema.SKIP_BIT, schema.IMAGE_BIT]
    assert all(b & (b - 1) == 0 and schema.ROLE_MASK < b < 1 << schema.VALUE_SHIFT for b in bits)
    assert len(set(bits)) == 3
    assert schema.CATEGORY_NAMES == ("keyboard", "mouse_op", "mouse_nop", "screen")


def test_the_compiled_program_reads_the_plan_s_op_codes():
    """The compiled accumulation runs the number program by op code: its copies of the codes are the plan's."""
    from owa_metrics.functional.plan import OPS

    if not decode_kernel.available():
        pytest.skip("numba is not available: no compiled kernel to check")
    assert accumulate_kernel.compiled_ops() == tuple(range(len(OPS)))
    assert [name.lower() for name in accumulate_kernel.OP_NAMES] == list(OPS)
    # the plan's tables go in by position: `TABLES` is the loop's own parameter order
    import inspect

    loop = getattr(accumulate_kernel._accumulate, "py_func", accumulate_kernel._accumulate)
    parameters = list(inspect.signature(loop).parameters)
    start = parameters.index(accumulate_kernel.TABLES[0])
    assert tuple(parameters[start:start + len(accumulate_kernel.TABLES)]) == accumulate_kernel.TABLES


def test_no_module_copies_the_codes_as_literals():
    """Enums are defined once: no other module of the package defines a Kind, Category, Status or Role."""
    import pathlib
    import re

    root = pathlib.Path(schema.__file__).parent
    defined = {str(p.relative_to(root)) for p in root.rglob("*.py")
               if re.search(r"^class (Kind|Category|Status|Role)\(", p.read_text(), re.M)}
    assert defined == {"schema.py"}
