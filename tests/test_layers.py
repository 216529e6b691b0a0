"""The package's layers import only downwards, and no import cycle exists.

Every ``import`` in ``modtrace/`` is read from the source (inside functions
too); imports under ``if TYPE_CHECKING:`` count for the layer rules and for
cycles: they never run, but two modules that name each other's types are one
design, and a ``Protocol`` or a module below both takes them apart.  The
layers are drawn in docs/development.md.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "modtrace"

# The layers are the package's folders: a module's layer is the folder it lives in
# (longest matching prefix wins), and each layer imports only the layers below it.
LAYERS: dict[str, str] = {
    "modtrace._version": "core",
    "modtrace.core": "core",
    "modtrace.tracking": "tracking",
    "modtrace.store": "store",
    "modtrace.analysis": "analysis",
    "modtrace.renderers": "renderers",
    "modtrace.results": "results",
    "modtrace.api": "api",
    "modtrace.recording": "recording",
    "modtrace.cli": "cli",
    "modtrace.__main__": "cli",
    "modtrace": "package",
}
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "tracking": {"core", "tracking"},
    "store": {"core", "store"},
    "analysis": {"core", "analysis"},
    "renderers": {"core", "renderers"},
    "results": {"core", "store", "analysis", "results"},
    "api": {"core", "store", "analysis", "results", "api"},
    "recording": {"core", "tracking", "store", "results", "recording"},
    "cli": {"core", "renderers", "api", "recording", "cli"},
    "package": {"core", "tracking", "recording", "api", "package"},
}
# Type-only imports a layer may make beyond ALLOWED: renderers name the analysis
# results they render in annotations.
TYPE_ONLY: dict[str, set[str]] = {"renderers": {"analysis"}}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    type_only: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exists(module: str) -> bool:
    base = PACKAGE.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_of(path: Path) -> list[Import]:
    source = _module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "modtrace":
                    found.append(Import(source, alias.name, node.lineno, type_only))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.split(".")[0] == "modtrace":
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    found.append(Import(source, sub if _exists(sub) else module, node.lineno, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def _all_imports() -> list[Import]:
    return [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in _imports_of(path)]


def layer_of(module: str) -> str:
    """The module's layer; a module no entry of LAYERS places (a new one) has none: place it."""
    found = [p for p in LAYERS if module == p or (p != "modtrace" and module.startswith(p + "."))]
    assert found, f"{module} is in no layer: add it to LAYERS in tests/test_layers.py"
    return LAYERS[max(found, key=len)]


def test_the_walk_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    imports = _all_imports()
    assert len({i.source for i in imports}) > 30
    # the recorder imports the join layer inside a method; the CLI imports lazily inside commands
    assert any(i.source == "modtrace.recording.analysing" and i.target == "modtrace.results.materialize" for i in imports)
    assert any(i.type_only for i in imports)
    for module in {i.source for i in imports} | {i.target for i in imports}:
        assert _exists(module), module
    for path in PACKAGE.rglob("*.py"):  # every module has its place, importing or not
        layer_of(_module_name(path))


def test_layers_import_only_downwards() -> None:
    wrong = []
    for imp in _all_imports():
        src, dst = layer_of(imp.source), layer_of(imp.target)
        allowed = ALLOWED[src] | (TYPE_ONLY.get(src, set()) if imp.type_only else set())
        if dst not in allowed:
            wrong.append(f"{imp.source}:{imp.line} ({src}) imports {imp.target} ({dst})")
    assert not wrong, "\n".join(wrong)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


# Cycles not yet taken apart.  Each fails the test once it is gone, so that its entry goes too.
KNOWN_CYCLES: list[list[str]] = []


def _import_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in _all_imports():
        if imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    return edges


def test_no_import_cycle_anywhere() -> None:
    """No two modules import each other, type-only imports included."""
    found = _cycles(_import_edges())
    assert [c for c in found if c not in KNOWN_CYCLES] == []
    gone = [c for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"no longer a cycle: take it out of KNOWN_CYCLES: {gone}"


def test_type_only_imports_make_cycles_too() -> None:
    """The compiled detail and the tracker once named each other's types only; such an edge counts."""
    edges = _import_edges()
    typed = {(i.source, i.target) for i in _all_imports() if i.type_only}
    assert ("modtrace.api._cli", "modtrace.api") in typed  # the walk sees them ...
    assert "modtrace.api" in edges["modtrace.api._cli"]  # ... and the cycle search follows them
    assert "modtrace.tracking.tracker" not in edges.get("modtrace.tracking.compiled", set())


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module,layer", [
    ("modtrace.store.migrate", "store"), ("modtrace.analysis.stream", "analysis"), ("modtrace.cli._options", "cli"),
    ("modtrace.core.contracts", "core"), ("modtrace", "package"), ("modtrace.results.materialize", "results"),
    ("modtrace.core.step_rules", "core"), ("modtrace.tracking.step_kind", "tracking"), ("modtrace.store.roots", "store"),
    ("modtrace.recording.script_runner", "recording"), ("modtrace._version", "core"),
])
def test_modules_are_placed_in_their_layer(module: str, layer: str) -> None:
    assert layer_of(module) == layer


def test_the_package_root_holds_only_its_entry_points() -> None:
    """Every module lives in its layer's folder; the root keeps the package's own three files."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "_version.py"]
    assert len({layer for layer in LAYERS.values()}) <= 10


def test_the_cli_issues_no_sql() -> None:
    """The CLI reaches the database only through modtrace.api: no SQLAlchemy, no driver, no SQL text."""
    wrong = []
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            wrong += [f"{path.name}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[0] in ("sqlalchemy", "sqlite3", "psycopg")]
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if any(word in node.value for word in ("SELECT ", "INSERT ", "DELETE ", "UPDATE ")):
                    wrong.append(f"{path.name}:{node.lineno} has SQL text {node.value[:40]!r}")
    assert not wrong, "\n".join(wrong)


def test_shared_cli_options_are_declared_once() -> None:
    """--db, --format, --rank and --quiet come from modtrace/cli/_options.py, one decorator each."""
    shared = {"--db", "--format", "--rank", "--quiet", "-q"}
    found = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "option":
                names = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
                found += [(path.name, name) for name in names & shared]
    assert sorted(found) == [("_options.py", "--db"), ("_options.py", "--format"), ("_options.py", "--quiet"),
                             ("_options.py", "--rank"), ("_options.py", "-q")]


@pytest.mark.parametrize("command", [("tree", "r"), ("diff", "a", "b"), ("report", "r", "-o", "x.html")])
def test_rank_means_the_same_on_every_command(command: tuple[str, ...], run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(*command, "--rank", "-1")
    assert result.code == 2
    assert "'--rank'" in result.err and "-1 is not in the range x>=0" in result.err


TESTS = Path(__file__).resolve().parent


def test_the_tests_mirror_the_package() -> None:
    """tests/X/ tests modtrace/X/; besides those only the helpers, the data and the real clients."""
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders - packages == {"clients", "data", "helpers"}


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/helpers/, never in another test module."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{path.relative_to(TESTS)} imports {n}" for n in names
                      if n.rpartition(".")[2].startswith("test_") or n.split(".")[0] in {"conftest"}]
    assert not wrong, "\n".join(wrong)
