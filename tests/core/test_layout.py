"""The package's floor plan holds: every import inside ``flashref`` resolves, none goes round in
a cycle or up into a package that contains it, and the layers import only downwards.

Imports inside functions count as much as those at the top of a module: a lazy import still
ties the two modules together, and a cycle hidden in a function is still a cycle. Read from
the source with ``ast``, so no module is imported and no GPU, CuPy or torch is needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import flashref

ROOT = Path(flashref.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ("flashref", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = {name for name, p in MODULES.items() if p.name == "__init__.py"}


def _top_level_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (what ``from m import x`` finds)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # names defined under a guard count too
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
DEFINED = {name: _top_level_names(path) for name, path in MODULES.items()}


def _from_module(name: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` in module ``name`` reads from, relative ones resolved."""
    if not node.level:
        return node.module or ""
    base = (name if name in PACKAGES else name.rpartition(".")[0]).split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports(name: str):
    """(line, imported module, name taken from it or None) for every import in the module
    that reaches into flashref."""
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "flashref":
                    yield node.lineno, a.name, None
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(name, node)
            if module.split(".")[0] != "flashref":
                continue
            for a in node.names:
                if f"{module}.{a.name}" in MODULES:
                    yield node.lineno, f"{module}.{a.name}", None
                else:
                    yield node.lineno, module, a.name


EDGES = {name: list(_imports(name)) for name in MODULES}


def test_every_import_resolves():
    """Each ``from flashref.x import y`` names a module that exists and a name it defines."""
    bad = []
    for name, edges in EDGES.items():
        for line, target, what in edges:
            if target not in MODULES:
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line}: no module {target}")
            elif what is not None and what != "*" and what not in DEFINED[target]:
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line}: {target} has no {what}")
    assert not bad, "\n".join(bad)


def _module_aliases(name: str) -> dict[str, str]:
    """{local name: module} for each flashref module the module binds to a name (``import
    flashref.gpu as fg``, ``from flashref.gpu import decode``)."""
    aliases = {}
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(name, node)
            for a in node.names:
                if f"{module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{module}.{a.name}"
    return aliases


def test_every_attribute_of_an_imported_module_exists():
    """``gpu.check_inputs`` where ``gpu`` is ``flashref.gpu``: the attribute is defined there
    (or is a submodule), so a name that moved to another module is caught without a GPU."""
    bad = []
    for name, path in MODULES.items():
        aliases = _module_aliases(name)
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                target = aliases.get(node.value.id)
                if target is None or node.attr in DEFINED[target]:
                    continue
                if f"{target}.{node.attr}" not in MODULES:
                    bad.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: {target} has no {node.attr}"
                    )
    assert not bad, "\n".join(bad)


def _cycles(edges: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle."""
    graph = {n: sorted({t for _, t, _ in e if t in MODULES and t != n}) for n, e in edges.items()}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    cycles = _cycles(EDGES)
    assert not cycles, "modules that import each other, directly or round a loop:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_cycle_finder_finds_a_planted_cycle():
    """The check above can fail: two modules planted to import each other are reported."""
    planted = dict(EDGES)
    planted["flashref.softmax"] = [*EDGES["flashref.softmax"], (1, "flashref.state", None)]
    planted["flashref.state"] = [*EDGES["flashref.state"], (1, "flashref.softmax", None)]
    assert ["flashref.softmax", "flashref.state"] in _cycles(planted)


def test_no_upward_import():
    """No module takes a name from the face of a package that contains it: the face
    (``__init__``) re-exports its modules, so such an import runs the other way round."""
    bad = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: imports {what} from {target}"
        for name, edges in EDGES.items()
        for line, target, what in edges
        if target in PACKAGES and name != target and name.startswith(target + ".")
    ]
    assert not bad, "\n".join(bad)


# The package root holds the NumPy core and the public adapter (torch); everything else is a
# subpackage named for what it is.
ROOT_MODULES = {
    "__init__",
    "_checks",
    "_blas_flags",
    "softmax",
    "state",
    "attention",
    "backward",
    "decode",
    "kvcache",
    "varlen",
    "variants",
    "io_model",
    "tile_trace",
    "torch",
}
ROOT_PACKAGES = {
    "ring",
    "exercises",
    "hardware",
    "gpu",
    "kernels",
    "recorded",
    "transformer",
    "bench",
}
CORE = tuple(sorted(ROOT_MODULES - {"__init__", "torch"}))

# (layer, what it must not import): each layer imports only the ones below it. From the
# ground up: the NumPy core; hardware (NumPy models of the chip); the GPU runtime; the torch
# adapter, the ring and the exercise checkers; the readers of recorded results and the
# chapter-8 model; the measuring harness on top.
ABOVE_GPU = ("flashref.bench", "flashref.recorded", "flashref.transformer", "flashref.exercises")
LAYERS = [
    ("flashref.hardware", ("flashref.gpu", *ABOVE_GPU, "flashref.torch", "flashref.ring")),
    ("flashref.gpu", (*ABOVE_GPU, "flashref.torch", "flashref.ring")),
    ("flashref.exercises", ("flashref.bench", "flashref.recorded", "flashref.transformer")),
    ("flashref.ring", ("flashref.bench", "flashref.recorded", "flashref.transformer")),
    ("flashref.torch", ("flashref.bench", "flashref.recorded", "flashref.transformer")),
    ("flashref.recorded", ("flashref.bench", "flashref.transformer", "flashref.torch")),
    ("flashref.transformer", ("flashref.bench", "flashref.recorded")),
]
# NumPy-only: what a reader without a GPU imports. None of it may import the GPU runtime
# (importing flashref.gpu loads its every module).
NUMPY_ONLY = (
    *(f"flashref.{m}" for m in CORE),
    "flashref.__init__",
    "flashref.hardware",
    "flashref.exercises",
    "flashref.ring.simulate",
)


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_root_holds_the_core_alone():
    """Every module at the package root is one of the core's (or the torch adapter), every
    folder one of the named subpackages."""
    modules = {p.stem for p in ROOT.glob("*.py")}
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert modules == ROOT_MODULES, (modules - ROOT_MODULES, ROOT_MODULES - modules)
    assert folders == ROOT_PACKAGES, (folders - ROOT_PACKAGES, ROOT_PACKAGES - folders)


@pytest.mark.parametrize("layer,forbidden", LAYERS, ids=[layer for layer, _ in LAYERS])
def test_layers_import_downwards(layer, forbidden):
    bad = []
    for name, edges in EDGES.items():
        if not _inside(name, layer):
            continue
        for line, target, _ in edges:
            if any(_inside(target, f) for f in forbidden):
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line}: imports {target}")
    assert not bad, "\n".join(bad)


def _numpy_only_offenders(edges: dict) -> list[str]:
    bad = []
    for name, found in edges.items():
        top = "flashref.__init__" if name == "flashref" else name
        if not any(_inside(top, n) for n in NUMPY_ONLY):
            continue
        for line, target, _ in found:
            if any(
                _inside(target, f) for f in ("flashref.gpu", "flashref.bench", "flashref.torch")
            ):
                bad.append(f"{name}:{line}: imports {target}")
    return bad


def test_no_numpy_only_module_imports_the_gpu_runtime():
    """The core, the chip's models, the exercise checkers and the simulated ring import no
    GPU runtime, harness or torch adapter, at the top or inside a function."""
    bad = _numpy_only_offenders(EDGES)
    assert not bad, "\n".join(bad)


def test_the_numpy_only_check_can_fail():
    planted = dict(EDGES)
    planted["flashref.hardware.hopper"] = [
        *EDGES["flashref.hardware.hopper"],
        (1, "flashref.gpu.tma", None),
    ]
    assert _numpy_only_offenders(planted) == [
        "flashref.hardware.hopper:1: imports flashref.gpu.tma"
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_reaches(trees: dict) -> list[str]:
    """Each name with a leading underscore that one module takes from another: imported
    (``from flashref.attention import _load``) or read through a module
    (``attention._load``). A private module's own names are private to it too."""
    bad = []
    for name, tree in trees.items():
        aliases = _module_aliases(name) if name in TREES else {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _from_module(name, node)
                for a in node.names:
                    if module.split(".")[0] == "flashref" and _private(a.name):
                        if f"{module}.{a.name}" not in MODULES:  # a private module is fine
                            bad.append(f"{name}:{node.lineno}: imports {module}.{a.name}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                target = aliases.get(node.value.id)
                if target and _private(node.attr) and f"{target}.{node.attr}" not in MODULES:
                    bad.append(f"{name}:{node.lineno}: reads {target}.{node.attr}")
    return bad


def test_names_used_across_modules_are_public():
    """A function or constant another module uses is part of its module's interface: it has
    no leading underscore (private modules, such as ``flashref.gpu._host``, may be
    imported: their names say what they are)."""
    bad = _private_reaches(TREES)
    assert not bad, "\n".join(bad)


def test_the_private_name_check_can_fail():
    planted = {"flashref.kvcache": ast.parse("from .attention import _pack\n")}
    assert _private_reaches(planted) == ["flashref.kvcache:1: imports flashref.attention._pack"]
