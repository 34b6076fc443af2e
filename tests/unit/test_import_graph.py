"""No two modules of parley import each other at their top, TYPE_CHECKING imports included: a module that
needs another's type takes a Protocol of its own instead (an import inside a function, made when it runs,
is how a package's registry reaches its parts). The call's parts each take what they act on, never the
Call (issue 43), so a cycle anywhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import parley

PACKAGE = Path(parley.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports at its top (under `if TYPE_CHECKING:` and in `try`
    too): `from parley.x import y` counts `parley.x.y` when that is a module, else `parley.x`."""
    found: set[str] = set()
    for node in _top_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            found |= {inner for alias in node.names if (inner := _inner(alias.name)) in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named = {_inner(f"{node.module}.{alias.name}") for alias in node.names} & modules
            found |= named or ({_inner(node.module)} & modules)
    return found


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    statements: list[ast.stmt] = []
    for node in body:
        statements.append(node)
        if isinstance(node, ast.If | ast.Try):
            nested = [*node.body, *node.orelse]
            if isinstance(node, ast.Try):
                nested += [*node.finalbody, *(s for handler in node.handlers for s in handler.body)]
            statements += _top_level(nested)
    return statements


def _inner(name: str) -> str:
    return name.removeprefix("parley.") if name.startswith("parley.") else ""


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) - {name} for name, path in paths.items()}


def test_no_modules_import_each_other() -> None:
    graph = package_graph()
    # The graph is read: a module that imports Call, a part that imports the replies.
    assert len(graph) > 100 and "engines.llm" in graph["engines.llm_llamacpp"]
    assert "call" in graph["agent.events"] and "replies" in graph["turn_decisions"]
    assert cycles(graph) == []


def test_a_cycle_is_found_wherever_it_is() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]
