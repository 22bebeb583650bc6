"""The package's layout: modules named for their step import each other without a cycle, and
`draftfit --help` / `check` stay light (no torch or vLLM)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "draftfit"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    return ast.walk(tree)


def import_graph() -> dict[str, set[str]]:
    """Module → the draftfit modules it imports at run time anywhere in its text (function bodies
    included; imports for type annotations only are not)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_init(name: str, graph: dict[str, set[str]]) -> bool:
    return any(other.startswith(name + ".") for other in graph)


def test_no_import_cycle_between_modules():
    graph = import_graph()
    # a submodule importing its own package's __init__ (which gathers the submodules) is not a
    # cycle between steps; everything else is
    trimmed = {m: {t for t in edges if not (_is_package_init(t, graph) and m.startswith(t + "."))}
               for m, edges in graph.items()}
    assert cycles(trimmed) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


@pytest.mark.parametrize("modules, heavy", [
    (["draftfit.cli", "draftfit.cli.check", "draftfit.methods", "draftfit.records"], ["torch", "vllm", "transformers"]),
    (["draftfit.report", "draftfit.explore", "draftfit.cli.report"], ["torch", "vllm", "transformers", "matplotlib"]),
], ids=["help-and-check", "report"])
def test_light_imports(modules, heavy):
    code = f"import sys, {', '.join(modules)}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_step_profiling_is_an_engine_capability_checked_before_anything_loads(tmp_path):
    from click.testing import CliRunner

    from draftfit.cli import cli
    from draftfit.engines import engine_class

    assert engine_class("vllm").profiles_steps and not engine_class("transformers").profiles_steps
    study = tmp_path / "study.yaml"
    study.write_text("engine: transformers\n")
    candidate = Path(__file__).resolve().parents[1] / "candidates" / "ngram-5.yaml"
    result = CliRunner().invoke(cli, ["rank", str(candidate), "--study", str(study), "--reports-dir", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "the transformers engine cannot time engine steps" in result.output
    assert "--latency-source roofline with --gpu NAME" in result.output
    assert not (tmp_path / "r").exists()
