"""The import direction of STYLE.md, checked on the source with `ast` (nothing is imported).

    specs -> plan -> cost -> sim -> search -> report | export | run | calibrate

* The core needs only numpy: torch, torchtitan, Megatron, DeepSpeed, TorchRec and
  matplotlib may be imported at module level only inside export/, run/, calibrate/ and
  report/plots.py (elsewhere, a function may import them lazily).
* Layers never import the layers after them, not even lazily inside a function: specs/
  knows nothing of plan/, cost/, sim/, search/ (but specs/engine.py states an engine's bounds
  in plan/'s axes and space limits); plan/ nothing of cost/, sim/, search/; cost/ nothing of
  search/ or the CLI.
* No import circle among paraplan's modules, and no module imports another module's
  private (`_name`) helpers: module-level and function-level imports alike.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "paraplan"

HEAVY = ("torch", "torchtitan", "megatron", "deepspeed", "torchrec", "matplotlib")
HEAVY_ALLOWED = ("paraplan.export", "paraplan.run", "paraplan.calibrate", "paraplan.report.plots")

# package -> packages (or modules) it must never import
FORBIDDEN = {
    # an engine (specs/engine.py) is an input like a cluster, whose bounds are a part of the plan space
    "paraplan.specs.engine": ("paraplan.cost", "paraplan.sim", "paraplan.search"),
    "paraplan.specs": ("paraplan.plan", "paraplan.cost", "paraplan.sim", "paraplan.search"),
    "paraplan.plan": ("paraplan.cost", "paraplan.sim", "paraplan.search"),
    "paraplan.cost": ("paraplan.search", "paraplan.cli"),
    # cost reads sim/schedules.py's task lists as data (estimate simulates them, evaluate counts
    # FSDP2's gathers on them); the simulator never reads the cost model
    "paraplan.sim": ("paraplan.cost", "paraplan.search"),
}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


MODULES = _modules()


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """Absolute dotted name that a `from X import ...` reads, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, *, module_level_only: bool) -> list[tuple[str, int]]:
    """(imported dotted name, line) for every import of a module. With `module_level_only`,
    imports inside function bodies (which run only when called) are left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, path, child)
                found.append((base, child.lineno))
                # `from .. import cost` imports the subpackage paraplan.cost
                found.extend((f"{base}.{alias.name}", child.lineno) for alias in child.names
                             if alias.name != "*")
            visit(child)

    visit(tree)
    return found


def test_every_module_is_seen():
    names = {m for m, _ in MODULES}
    # a check over nothing passes trivially: make sure the walk finds the real layers
    for layer in ("paraplan.specs.model", "paraplan.plan.space", "paraplan.cost.evaluate",
                  "paraplan.sim.engine", "paraplan.search.planner", "paraplan.cli"):
        assert layer in names


def test_resolve_relative_imports():
    node = ast.parse("from ..plan.axes import Recompute").body[0]
    assert _resolve("paraplan.cost.memory", PACKAGE / "cost" / "memory.py", node) == "paraplan.plan.axes"
    node = ast.parse("from ... import units").body[0]
    assert _resolve("paraplan.specs.catalog", PACKAGE / "specs" / "catalog" / "__init__.py",
                    node) == "paraplan"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_heavy_framework_at_module_level(module, path):
    if any(_within(module, allowed) for allowed in HEAVY_ALLOWED):
        pytest.skip("optional-extras module")
    bad = [(name, line) for name, line in _imports(module, path, module_level_only=True)
           if name.split(".")[0] in HEAVY]
    assert not bad, (f"{path.relative_to(SRC)} imports {', '.join(f'{n} (line {ln})' for n, ln in bad)} "
                     f"at module level; only {', '.join(HEAVY_ALLOWED)} may")


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_layers_import_only_earlier_layers(module, path):
    # the most specific layer's rule (FORBIDDEN lists a module before its package)
    rules = [forbidden for layer, forbidden in FORBIDDEN.items() if _within(module, layer)]
    if not rules:
        pytest.skip("no layer rule for this module")
    bad = [(name, line) for name, line in _imports(module, path, module_level_only=False)
           for forbidden in rules[0] if _within(name, forbidden)]
    assert not bad, (f"{path.relative_to(SRC)} imports "
                     f"{', '.join(f'{n} (line {ln})' for n, ln in bad)}: against the data flow")


def test_the_checker_catches_a_violation(tmp_path):
    # The rule must be able to fail: a fake specs module importing plan/ and torch.
    fake = tmp_path / "paraplan" / "specs" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("import torch\nfrom ..plan.space import PlanBatch\ndef f():\n    import matplotlib\n")
    names = [n for n, _ in _imports("paraplan.specs.bad", fake, module_level_only=True)]
    assert "torch" in names and "paraplan.plan.space" in names and "matplotlib" not in names
    lazy = [n for n, _ in _imports("paraplan.specs.bad", fake, module_level_only=False)]
    assert "matplotlib" in lazy


# --- circles and private names ---------------------------------------------------------------

def _import_graph(modules: list[tuple[str, Path]]) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the paraplan modules it imports, the private imports as "importer <- name").

    `from X import a` reads X (its __init__ runs) and, where X.a is a module, X.a; a name
    starting with one underscore imported from another module is private. Imports inside
    functions count: they run when the function does."""
    names = {m for m, _ in modules}
    edges: dict[str, set[str]] = {m: set() for m in names}
    private = []
    for module, path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges[module].update(a.name for a in node.names if a.name in names and a.name != module)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
                edges[module].update(t for t in targets if t in names and t != module)
                if base in names and base != module:
                    private += [f"{module} <- {base}.{a.name}" for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
    return edges, private


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
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
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def test_no_import_circle():
    edges, _ = _import_graph(MODULES)
    circles = _circles(edges)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_private_name_imported_from_another_module():
    _, private = _import_graph(MODULES)
    assert not private, "private names imported across modules (make them public where they are shared): " + \
        ", ".join(private)


def test_the_circle_and_private_checks_can_fail(tmp_path):
    # a fake package: a imports b at module level, b imports a inside a function (a circle),
    # and b reads a's private helper
    pkg = tmp_path / "paraplan"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\ndef _helper():\n    pass\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .a import _helper\n    return _helper\n")
    (pkg / "c.py").write_text("from .sub.a import _helper as helper\nfrom .sub import b\n")
    modules = [("paraplan", pkg / "__init__.py"), ("paraplan.sub", pkg / "sub" / "__init__.py"),
               ("paraplan.sub.a", pkg / "sub" / "a.py"), ("paraplan.sub.b", pkg / "sub" / "b.py"),
               ("paraplan.c", pkg / "c.py")]
    edges, private = _import_graph(modules)
    assert _circles(edges) == [["paraplan.sub.a", "paraplan.sub.b"]]
    assert sorted(private) == ["paraplan.c <- paraplan.sub.a._helper", "paraplan.sub.b <- paraplan.sub.a._helper"]
