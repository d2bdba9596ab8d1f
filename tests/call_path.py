"""Which of flashref's modules an argument passes through on its way from a call to the launch.

``module_stays(call, table)`` runs ``call()`` under ``sys.settrace`` and follows ``table`` (a
block table, say) in every form flashref gives it on the way: any array of its shape and an
integer dtype (the table itself, its checked int32 copy, its device copy, a view of it) and
the address of any such array (what a launch passes). A flashref function entered with one
of them among its arguments (or inside a tuple, list or dict argument) joins the path. The
path is the list of modules, one entry per *stay*: a call into another module starts a stay,
and so does the return to the caller's module. It ends at the launch: the first call of a
function called ``launch`` in ``flashref.gpu`` (a plan's driver launch,
``_host.Plan.launch``, or a general route's CuPy launch such as ``decode.launch.launch``) or
into ``flashref.gpu._driver``.
"""

from __future__ import annotations

import sys


def _address(x):
    data = getattr(x, "data", None)
    if hasattr(data, "ptr"):  # CuPy
        return data.ptr
    if hasattr(x, "data_ptr"):  # torch
        return x.data_ptr()
    face = getattr(x, "__array_interface__", None)
    return None if face is None else face["data"][0]


def _values(v):
    if isinstance(v, tuple | list):
        return [y for x in v for y in _values(x)]
    if isinstance(v, dict):
        return [y for x in v.values() for y in _values(x)]
    return [v]


def _is_launch(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    if module == "flashref.gpu._driver":
        return True
    return module.startswith("flashref.gpu") and frame.f_code.co_name == "launch"


def module_stays(call, table) -> tuple[list[str], bool]:
    """The modules of the path of ``table`` through ``call()`` (see the module), and whether
    the path reached a launch."""
    shape = tuple(table.shape)
    addresses: set[int] = set()
    stack: list[str] = []  # the modules of the followed frames, innermost last
    path: list[str] = []
    done = []

    def follows(v) -> bool:
        if isinstance(v, bool):
            return False
        if isinstance(v, int):
            return v in addresses
        try:
            if tuple(v.shape) != shape or str(v.dtype).removeprefix("torch.")[:4] not in (
                "int1",
                "int3",
                "int6",
                "int8",
                "uint",
            ):
                return False
        except Exception:
            return False
        a = _address(v)
        if a:
            addresses.add(a)
        return True

    def note():
        if stack and (not path or path[-1] != stack[-1]):
            path.append(stack[-1])

    def local(frame, event, arg):
        if event == "return":
            stack.pop()
            if not done:
                note()
        return local

    def tracer(frame, event, arg):
        if done or event != "call":
            return None
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("flashref"):
            return None
        code = frame.f_code
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
        values = _values([frame.f_locals.get(name) for name in code.co_varnames[:n]])
        if not any([follows(v) for v in values]):
            return None
        stack.append(module)
        note()
        if _is_launch(frame):
            done.append(True)
            return None
        return local

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return [m.removeprefix("flashref.") for m in path], bool(done)
