"""The package's structure: public faces only across subpackages, an acyclic
import graph (lazy imports included), one registry of random-key tags."""

import ast
import pathlib

import fedjax_pfl
from fedjax_pfl.core import KeyTag

ROOT = pathlib.Path(fedjax_pfl.__file__).parent


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path, path.name == "__init__.py"


def _imports(name, path, is_pkg):
    """``(imported module, imported names, line)`` of every import in the file,
    lazy ones (inside functions) included; relative imports resolved."""
    tree = ast.parse(path.read_text())
    pkg = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            names = [a.name for a in node.names]
            yield mod, names, node.lineno
            # "from pkg import submodule" imports the submodule too
            for n in names:
                yield f"{mod}.{n}", [], node.lineno


MODULES = {name: (path, is_pkg) for name, path, is_pkg in _modules()}


def _subpackage(mod):
    """The subpackage a module belongs to (None: the root package, with its
    top-level modules such as ``fedjax_pfl._xla_cpu``)."""
    parts = mod.split(".")
    if len(parts) < 2 or not MODULES.get(".".join(parts[:2]), (None, True))[1]:
        return None
    return parts[1]


def test_no_private_imports_across_subpackages():
    bad = []
    for name, (path, is_pkg) in MODULES.items():
        here = _subpackage(name)
        for mod, names, line in _imports(name, path, is_pkg):
            if not mod.startswith("fedjax_pfl.") or mod not in MODULES:
                continue
            there = _subpackage(mod)
            if there == here:
                continue
            private_mod = any(p.startswith("_") for p in mod.split(".")[1:])
            private_names = [n for n in names if n.startswith("_")]
            if private_mod or private_names:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports "
                           f"{mod} {private_names or ''}")
    assert not bad, "private imports across subpackages:\n" + "\n".join(bad)


def _graph():
    graph = {name: set() for name in MODULES}
    for name, (path, is_pkg) in MODULES.items():
        for mod, _, _ in _imports(name, path, is_pkg):
            if mod in MODULES and mod != name:
                graph[name].add(mod)
    return graph


def _find_cycle(graph):
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def _package_face_edges(graph):
    """Drops the edges from a package's ``__init__`` to its own submodules (a
    package face re-exporting its implementation is not a circle)."""
    return {v: {w for w in ws if not w.startswith(v + ".")}
            for v, ws in graph.items()}


def test_module_import_graph_is_acyclic():
    cycle = _find_cycle(_package_face_edges(_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_subpackage_import_graph_is_acyclic():
    sub = {}
    for v, ws in _graph().items():
        a = _subpackage(v)
        if a is None:
            continue
        sub.setdefault(a, set()).update(
            b for b in map(_subpackage, ws) if b is not None and b != a)
    cycle = _find_cycle({k: sub.get(k, set()) for k in sub})
    assert cycle is None, "subpackage cycle: " + " -> ".join(cycle)


def test_layers_point_one_way():
    """data/models/validation <- core <- leaves <- toolkit <- algorithms <-
    experiments: nothing imports a layer above its own."""
    layer = {"validation": 0, "data": 1, "models": 1, "core": 2, "aggregators": 3,
             "attacks": 3, "privacy": 3, "metrics": 3, "plots": 3, "toolkit": 4,
             "algorithms": 5, "experiments": 6}
    bad = []
    for v, ws in _graph().items():
        a = _subpackage(v)
        for w in ws:
            b = _subpackage(w)
            if a in layer and b in layer and layer[b] > layer[a]:
                bad.append(f"{v} -> {w}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_key_tags_are_unique_and_used_from_the_registry():
    values = [t.value for t in KeyTag]
    assert len(values) == len(set(values))
    bad = []
    for name, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None)
                    == "fold_in" and len(node.args) == 2
                    and isinstance(node.args[1], ast.Constant)):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not bad, "fold_in with a literal tag (use core.KeyTag):\n" + "\n".join(bad)


def test_toolkit_names_are_documented():
    from fedjax_pfl import toolkit

    names = [n for n in dir(toolkit) if not n.startswith("_")
             and callable(getattr(toolkit, n))]
    assert len(names) > 20
    missing = [n for n in names if not (getattr(toolkit, n).__doc__ or "").strip()]
    assert not missing, f"toolkit names without a docstring: {missing}"
