"""The package's layering, read from the code's imports (every import statement, at any depth,
``TYPE_CHECKING`` ones included): no import circle, no import from a lower layer to a higher
one, the job's processes never import each other, and Airflow and network code stay out of
``core`` (``docs/architecture.md``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_rover"
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"core"}),
    frozenset({"data", "storage", "history", "rpc"}),
    frozenset({"ps", "worker", "master", "dataworker"}),
    frozenset({"launchers", "hooks"}),
    frozenset({"operators", "sensors", "triggers", "plugins", "cli", "get_provider_info"}),
)
# each imports the others' wire (rpc) only
PROCESSES = frozenset({"ps", "worker", "master", "dataworker"})
AIRFLOW_FREE = frozenset(
    {"core", "data", "storage", "history", "rpc", "ps", "worker", "master", "dataworker"}
)
NETWORK = ("airflow", "grpc", "httpx", "fastapi", "uvicorn", "boto3", "botocore", "kubernetes")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> Iterator[str]:
    """Every module ``name`` imports (``from package import module`` names the module)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in MODULES else base


def layer_of(module: str) -> tuple[int, str]:
    top = module.split(".")[1] if "." in module else module
    for i, names in enumerate(LAYERS):
        if top in names:
            return i, top
    raise AssertionError(f"{module}: not in any layer of docs/architecture.md ({top!r})")


def graph() -> dict[str, set[str]]:
    return {name: {m for m in imports(name) if m in MODULES and m != name} for name in MODULES}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_in_a_layer() -> None:
    for name in MODULES:
        if name != "airflow_rover":
            layer_of(name)


def test_no_import_circle() -> None:
    assert cycles(graph()) == []


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    wrong = []
    for name, targets in graph().items():
        if name == "airflow_rover":
            continue
        (mine, top) = layer_of(name)
        for target in targets:
            if target == "airflow_rover":
                continue
            (theirs, other) = layer_of(target)
            if theirs > mine or (top in PROCESSES and other in PROCESSES and top != other):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.count(".") >= 1))
def test_airflow_and_network_code_stay_out_of_the_lower_layers(name: str) -> None:
    _, top = layer_of(name)
    outside = [m for m in imports(name) if not m.startswith("airflow_rover")]
    if top == "core":
        assert [m for m in outside if m.split(".")[0] in NETWORK] == []
    if top in AIRFLOW_FREE:
        assert [m for m in outside if m.split(".")[0] == "airflow"] == []


def test_the_checker_sees_a_circle_and_a_wrong_way_import() -> None:
    """The checks above are not vacuous: a circle and an upward edge are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("airflow_rover.core.spec") < layer_of("airflow_rover.master.job")
    assert "airflow_rover.core.spec" in graph()["airflow_rover.core.job_dir"]
