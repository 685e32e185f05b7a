"""The library (what `pip install kvzap` users import) never imports the workflow, and no two packages import each
other, directly or around a loop: read from every `import` in src/kvzap, function-local ones included."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
# The library: presses, surrogates, oracle scores and the facts they read. Everything else is the workflow.
LIBRARY = (
    "kvzap.pruning",
    "kvzap.surrogate",
    "kvzap.oracle",
    "kvzap.introspection",
    "kvzap.families",
    "kvzap.layer_types",
    "kvzap.window",
    "kvzap.fill",
    "kvzap.dtypes",
    "kvzap.atomic",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The kvzap modules `path` imports (`from kvzap import x` names kvzap.x when x is a module)."""
    found = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "kvzap"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "kvzap":
                continue
            for alias in node.names:
                child = f"{module}.{alias.name}"
                is_module = (SRC / Path(*child.split("."))).with_suffix(".py").exists() or (
                    SRC / Path(*child.split("."))
                ).is_dir()
                found.add(child if is_module else module)
    return found


GRAPH = {_module_name(p): _imports(p) for p in sorted((SRC / "kvzap").rglob("*.py"))}


def _in_library(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in LIBRARY)


def _package(module: str) -> str:
    """kvzap.x for every module under kvzap.x (the unit of the cycle check)."""
    return ".".join(module.split(".")[:2])


def test_the_scan_sees_the_imports_it_must():
    assert "kvzap.pruning.windowed_press" in GRAPH["kvzap.pruning.kvzap_press"]
    assert "kvzap.layer_types" in GRAPH["kvzap.families"]  # `from kvzap.layer_types import ...`
    assert "kvzap.evaluation.methods" in GRAPH["kvzap.plan.sweep"]  # `from kvzap.evaluation import methods`


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _in_library(m)))
def test_library_module_imports_no_workflow_module(module):
    upward = sorted(m for m in GRAPH[module] if m != "kvzap" and not _in_library(m))
    assert not upward, f"{module} (library) imports {upward} (workflow)"


def _package_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A loop of packages importing each other (depth-first search), or None."""
    edges = {}
    for module, imported in graph.items():
        for other in imported:
            if other != "kvzap" and _package(other) != _package(module):
                edges.setdefault(_package(module), set()).add(_package(other))
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (loop := visit(nxt)):
                return loop
        stack.pop()
        state[node] = "done"
        return None

    return next((loop for node in sorted(edges) if node not in state and (loop := visit(node))), None)


def test_no_package_level_cycle():
    loop = _package_cycle(GRAPH)
    assert loop is None, "package cycle: " + " -> ".join(loop)


def test_cycle_check_finds_a_cycle():
    """The check is not vacuous: a loop through two packages is found."""
    graph = {"kvzap.a.x": {"kvzap.b.y"}, "kvzap.b.y": {"kvzap.a.z"}, "kvzap.a.z": set()}
    assert _package_cycle(graph) == ["kvzap.a", "kvzap.b", "kvzap.a"]
    assert _package_cycle({"kvzap.a.x": {"kvzap.b.y"}, "kvzap.b.y": set()}) is None


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _in_library(m)))
def test_library_module_has_no_command_line(module):
    """Library code raises exceptions a caller can catch; exiting the process and parsing argv are the workflow's."""
    path = SRC / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names
    }
    assert not names & {"SystemExit", "argparse", "__name__"}, (
        f"{module}: {sorted(names & {'SystemExit', 'argparse', '__name__'})}"
    )


def _exits_outside_main(source: str) -> list[str]:
    """The functions (or module level) that raise SystemExit without being a `main`."""
    tree = ast.parse(source)
    outside = []

    def visit(node, function):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
            if function != "main":
                outside.append(function or "<module>")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return outside


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_only_a_main_exits_the_process(module):
    """Stages are libraries too (ablations and benchmarks import them): below `main` they raise a Refusal."""
    path = SRC / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    assert _exits_outside_main(path.read_text(encoding="utf-8")) == [], module


def test_the_exit_check_sees_a_helper_that_exits():
    helper = "def check(x):\n    if x:\n        raise SystemExit('no')\n\ndef main():\n    raise SystemExit('usage')\n"
    assert _exits_outside_main(helper) == ["check"]
    assert _exits_outside_main("if True:\n    raise SystemExit(1)\n") == ["<module>"]
