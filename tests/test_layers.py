"""The import graph: the library at the bottom, its clients around it, nothing running back up.

Every module of zerogr_core/, kernels/, pages/ and app.py is parsed with ``ast``; every import
(module level or inside a function) is an edge between the groups of :data:`LAYERS`. The
rules are those of docs/design.md ("Layers"): a group imports only groups of a lower layer
(groups of one layer are peers and do not import each other), so the graph between groups
has no cycle; only app.py and pages/ import the app's support.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: group -> layer. A module's group is the longest key that is a prefix of its dotted name.
#: 0-5: the library (what a serving team imports); 6-11: its clients.
LAYERS = {
    "zerogr_core.errors": 0, "zerogr_core.timing": 0, "zerogr_core.environment": 0,
    "zerogr_core.arg_types": 0,  # text -> numbers: the commands' arguments and the catalog's synth: specs
    "zerogr_kernels": 1, "zerogr_core.catalog": 1,
    "zerogr_core.devices": 1,  # where a call runs: a device= argument or --device, read one way
    "zerogr_core.index": 2,
    "zerogr_core.decode": 3,
    "zerogr_core.models": 4,
    "zerogr_core": 5, "zerogr_core.hf": 5,           # the public facade (package root, HF adapter)
    "zerogr_core.recsys": 6,                          # the studies, shared by the clients above
    "zerogr_core.bench": 7, "zerogr_core.serve": 7,   # benchmark suite, serving
    "zerogr_core.cli": 8,
    "zerogr_core.__main__": 9, "zerogr_core.app_support": 9,
    "pages": 10,
    "app": 11,
}
LIBRARY_TOP = 5
APP_SUPPORT_USERS = {"app", "pages"}

# Folder -> the package name it is imported as (kernels/ installs as zerogr_kernels).
SOURCES = {"zerogr_core": "zerogr_core", "kernels": "zerogr_kernels", "pages": "pages"}


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every source module of the project (tests excluded)."""
    found = {"app": ROOT / "app.py"}
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imported_names(name: str, path: Path) -> set[str]:
    """Absolute names of every module ``name`` imports (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            out.add(stem)
            out.update(f"{stem}.{alias.name}" for alias in node.names)   # `from pkg import module`
    return out


def group_of(name: str) -> str | None:
    best = None
    for group in LAYERS:
        if (name == group or name.startswith(group + ".")) and (best is None or len(group) > len(best)):
            best = group
    return best


def group_edges() -> dict[tuple[str, str], list[str]]:
    """(importer's group, imported group) -> the ``module -> module`` imports that make it."""
    mods = modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path in mods.items():
        source = group_of(name)
        assert source is not None, f"{path}: module {name} has no layer in LAYERS"
        for target in imported_names(name, path):
            if target not in mods:            # third-party, or `from pkg import attribute`
                continue
            dest = group_of(target)
            if dest != source:
                edges.setdefault((source, dest), []).append(f"{name} -> {target}")
    return edges


def test_every_module_has_a_layer():
    for name, path in modules().items():
        assert group_of(name) is not None, f"{path.relative_to(ROOT)}: add {name} to LAYERS"


def test_imports_only_run_down_the_layers():
    upward = [f"{' / '.join(sorted(set(how)))} (layer {LAYERS[a]} imports layer {LAYERS[b]})"
              for (a, b), how in sorted(group_edges().items()) if LAYERS[a] <= LAYERS[b]]
    assert not upward, "imports that run up (or between peers):\n" + "\n".join(upward)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for a, b in group_edges():
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(trail + [node, nxt])
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_only_the_app_imports_its_support():
    users = sorted({how for (a, b), hows in group_edges().items() if b == "zerogr_core.app_support"
                    and a not in APP_SUPPORT_USERS for how in hows})
    assert not users, "app_support is the app's alone:\n" + "\n".join(users)


def test_the_library_imports_no_client():
    edges = group_edges()
    library = {g for g, layer in LAYERS.items() if layer <= LIBRARY_TOP}
    wrong = sorted(h for (a, b), hows in edges.items() if a in library and b not in library for h in hows)
    assert not wrong, "library modules importing clients:\n" + "\n".join(wrong)


def test_the_graph_reader_sees_imports():
    """The reader resolves relative imports and finds imports inside functions."""
    edges = group_edges()
    assert ("zerogr_core.decode", "zerogr_kernels") in edges
    assert ("zerogr_core.decode", "zerogr_core.index") in edges
    assert ("zerogr_core.cli", "zerogr_core.serve") in edges
    assert ("pages", "zerogr_core.app_support") in edges
    assert os.path.basename(modules()["zerogr_core.decode"]) == "__init__.py"


def test_no_kernel_module_is_named_after_an_op():
    """``zerogr_kernels`` binds each op over the module of the same name, which then cannot be
    imported as a module (``import zerogr_kernels.<name> as m`` gives the function)."""
    init = ast.parse((ROOT / "kernels" / "__init__.py").read_text())
    exported = next(ast.literal_eval(node.value) for node in init.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    named = sorted(p.stem for p in (ROOT / "kernels").glob("*.py") if p.stem in set(exported))
    assert not named, f"kernels/ modules named after an exported op: {named}"
