"""What a reader's function may return, and how far an answer is from the reference.

One rule for every checker, applied before any arithmetic on the answer:

- ``None`` is reported as a forgotten ``return``;
- a tuple where one array (or one float) was expected gets a hint: return the
  output alone, not ``(O, lse)``;
- a list is refused: the exercises ask for a NumPy array, like their inputs;
- an ``ndarray`` subclass is refused: a ``numpy.ma.MaskedArray`` would drop its
  masked elements out of any comparison (a fully masked answer would "match"),
  and ``numpy.matrix`` changes the shapes;
- anything else that is not an ``ndarray`` (a torch tensor, say) is refused by
  its type. It is never handed to NumPy, whose conversion may raise (a tensor
  that requires grad) or silently drop information (a complex number).

Each ``*_answer`` function returns ``(value, None)`` for an answer it accepts,
the value converted to float64, or ``(None, problem)`` saying what came back.
``excess`` then measures an accepted answer against the reference, in units of
the tolerance, without a warning of its own (``-inf - -inf`` included).
"""

from __future__ import annotations

import numpy as np

RETURNED_NONE = "the function returned None (is a `return` missing?)"
# A float64 solution with a known mistake reproduces the simulated mistake to about
# 1e-13 relative (rounding); 1e-9 leaves 10**4 of margin, and float32 rounding (1e-7
# and more) never reaches it.
TIGHT = 1e-9


def type_name(obj) -> str:
    """``list``, ``numpy.ma.MaskedArray``, ``torch.Tensor``: the type, where it comes from."""
    t = type(obj)
    module = t.__module__
    if module in ("builtins", "__main__"):
        return t.__qualname__
    if module.startswith("numpy.ma"):
        module = "numpy.ma"
    elif module.startswith("numpy"):
        module = "numpy"
    return f"{module}.{t.__qualname__}"


def not_an_array(got, what: str) -> str | None:
    """Why ``got`` is not a plain ``ndarray``, or None if it is one."""
    if got is None:
        return RETURNED_NONE
    if isinstance(got, tuple):
        return (
            f"expected one array ({what}), got a tuple of {len(got)} values: "
            f"return {what} alone, not ({what}, lse)"
        )
    if isinstance(got, list):
        return f"expected a numpy array, got a list (return {what} as a numpy array)"
    if isinstance(got, np.ma.MaskedArray):
        return "expected a plain numpy array, got a numpy.ma.MaskedArray (a mask hides values)"
    if isinstance(got, np.ndarray) and type(got) is not np.ndarray:
        return f"expected a plain numpy array, got a {type_name(got)} (an ndarray subclass)"
    if not isinstance(got, np.ndarray):
        return f"expected a numpy array, got {type_name(got)}"
    return None


def array_answer(got, shape: tuple, dtype=None, what: str = "O"):
    """Accept a plain float ndarray of ``shape``; ``dtype``, when given, exactly."""
    problem = not_an_array(got, what)
    if problem:
        return None, problem
    if got.shape != shape:
        return None, f"expected shape {shape}, got shape {got.shape}"
    if dtype is not None and got.dtype != dtype:
        return None, f"expected dtype {np.dtype(dtype)} (the input's), got {got.dtype}"
    if got.dtype.kind != "f":
        return None, f"expected a float array, got dtype {got.dtype}"
    return got.astype(np.float64), None


def float_answer(got, what: str = "o / l"):
    """Accept a real float: a Python float, a NumPy float scalar, or a 0-d float array."""
    if got is None:
        return None, RETURNED_NONE
    if isinstance(got, tuple):
        return None, f"expected one float ({what}), got a tuple of {len(got)} values"
    if isinstance(got, str):
        text = got if len(got) <= 20 else got[:17] + "..."
        return None, f"expected a float, got the string {text!r} (return the number)"
    if isinstance(got, np.ndarray) and type(got) is np.ndarray and got.shape != ():
        return None, f"expected a single float, got an array of shape {got.shape}"
    if isinstance(got, float | np.floating) or (
        type(got) is np.ndarray and got.shape == () and got.dtype.kind == "f"
    ):
        return float(got), None
    if isinstance(got, complex | np.complexfloating):
        return None, f"expected a real float, got {type_name(got)} {got!r}"
    return None, f"expected a float, got {type_name(got)}"


def state_answer(got, shapes: dict[str, tuple]):
    """Accept a state with array attributes named and shaped as in ``shapes`` (m, l, o).

    The value is a tuple of float64 arrays in the order of ``shapes``.
    """
    if got is None:
        return None, RETURNED_NONE
    parts = {}
    for name in ("m", "l"):
        try:
            parts[name] = getattr(got, name)
        except Exception:  # AttributeError, or anything a strange object raises
            hint = ""
            if isinstance(got, tuple):
                hint = f" of {len(got)} values (return SoftmaxState(m, l), not (m, l))"
            return None, f"expected a SoftmaxState (with .m and .l), got {type_name(got)}{hint}"
    values = []
    for name, shape in shapes.items():
        if name not in parts:
            try:
                parts[name] = getattr(got, name)
            except Exception:
                return None, f"expected a state with .{name}, got {type_name(got)} without it"
        value, problem = array_answer(parts[name], shape, np.float64, what=name)
        if problem:
            return None, f"{name}: {problem}"
        values.append(value)
    return tuple(values), None


def excess(expected, got, tol, nan_matches: bool = False) -> np.ndarray:
    """``|got - expected| / tol`` elementwise (float64), > 1 meaning outside the tolerance.

    Equal values, equal infinities included, give 0; a NaN in ``got`` gives inf
    (a NaN never passes), unless ``nan_matches`` and ``expected`` is NaN there
    too; a finite ``got`` against an infinite ``expected`` gives inf.
    """
    expected = np.asarray(expected, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    with np.errstate(all="ignore"):
        ratio = np.abs(got - expected) / tol
        ratio = np.where(np.isfinite(expected), ratio, np.inf)
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
        same = got == expected
        if nan_matches:
            same = same | (np.isnan(got) & np.isnan(expected))
        return np.where(same, 0.0, ratio)


def o_lse_answer(got, rows: int, dv: int, one_array: str):
    """Accept a tuple ``(O (rows, dv), lse (rows,))`` of plain float arrays; ``one_array`` is
    what to say when a single array comes back (why the lse is part of the answer)."""
    if got is None:
        return None, RETURNED_NONE
    if isinstance(got, np.ndarray):
        return None, f"expected (O, lse), got one array: {one_array}"
    if not isinstance(got, tuple):
        return None, f"expected a tuple (O, lse), got {type_name(got)}"
    if len(got) != 2:
        return None, f"expected a tuple (O, lse), got a tuple of {len(got)} values"
    O, problem = array_answer(got[0], (rows, dv), None, "O")
    if problem:
        return None, f"O: {problem}"
    lse, problem = array_answer(got[1], (rows,), None, "lse")
    if problem:
        return None, f"lse: {problem}"
    return (O, lse), None


def first_wrong_o_lse(O_ref, lse_ref, tols, value, tol_text, note=lambda r: "") -> str:
    """The first wrong row of O, or else of lse, expected against got; ``tol_text`` names
    O's and lse's tolerances, ``note(r)`` says what row ``r`` held (or "")."""
    for name, e, g, tol in zip(("O", "lse"), (O_ref, lse_ref), value, tols, strict=True):
        bad = excess(e, g, tol) > 1
        if not bad.any():
            continue
        r = int(np.argmax(bad.reshape(len(bad), -1).any(axis=1)))
        where, ev, gv = f"{name}, row {r}", e[r], g[r]
        if e.ndim == 2:
            c = int(np.argmax(bad[r]))
            where, ev, gv = f"{where} (the first wrong row), column {c}", e[r, c], g[r, c]
        return f"{where}: expected {ev:.6g}, got {gv:.6g}\n  {note(r)}tolerance {tol_text[name]}"
    return "no element outside the tolerance"
