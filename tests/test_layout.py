"""The shape of the code, checked with `ast` (no third-party tool): which
package may import which, no import cycles, and queue records read and
written only inside shm/ (docs/ARCHITECTURE.md, "Code layout")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "workers", "shm", "store", "perf", "spark")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("shoal", *parts))] = path  # installed as shoal.*
    return found


def imports(path: Path, known: dict[str, Path], type_checking: bool) -> set[str]:
    """The project modules `path` imports (with `type_checking`, also those
    imported only for annotations under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.body:
                    skipped.update(id(n) for n in ast.walk(child))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name in known:
                found.add(name)
    return found


def graph(type_checking: bool) -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known, type_checking) - {name} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


# At least this many modules per package (today: 58, 32, 18, 6, 12, 13): a
# package moved or renamed must fail here, not leave the rules below with
# nothing to check.
LEAST_MODULES = {"broker": 50, "workers": 28, "shm": 15, "store": 5, "perf": 10, "spark": 10}


def test_the_walk_finds_every_package() -> None:
    found = modules()
    for package, least in LEAST_MODULES.items():
        count = sum(1 for name in found if name.split(".")[1] == package)
        assert count >= least, f"{package}/: {count} modules found, expected {least} or more"


def test_no_import_cycles_even_for_annotations() -> None:
    """Modules that need each other see each other through a narrow
    Protocol (a channel's ChannelConnection, a consumer's DeliveryChannel,
    the scheduler's SchedulerView...), not by importing the whole class."""
    edges = graph(type_checking=True)
    assert sum(map(len, edges.values())) > 200, "the import walk found too few imports"
    assert cycles(edges) == []


MAX_LINES = 700


def test_modules_stay_small_unless_one_concept_needs_the_length() -> None:
    """A module over MAX_LINES says in its docstring why it is one concept."""
    assert len(modules()) >= sum(LEAST_MODULES.values())
    for name, path in modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            assert "one concept" in doc.lower(), f"{name}: {text.count(chr(10))} lines"


@pytest.mark.parametrize("package", ["shoal.shm", "shoal.store"])
def test_the_storage_layers_import_nothing_above_them(package: str) -> None:
    edges = graph(type_checking=True)
    assert sum(1 for name in edges if name.startswith(package)) >= 5
    for name, targets in edges.items():
        if name.startswith(package):
            above = sorted(t for t in targets if not t.startswith(package))
            assert not above, f"{name} imports {above}"


# What the sans-IO AMQP model may not use: sockets, processes, event loops,
# files and shared memory belong to the roles that drive it.
IO_MODULES = {
    "asyncio",
    "mmap",
    "multiprocessing",
    "os",
    "selectors",
    "signal",
    "socket",
    "subprocess",
    "threading",
    "uvloop",
}


def top_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_amqp_model_does_no_io() -> None:
    """broker/amqp/ (errors, routing, definitions, selectors) is tested
    without sockets: it imports no IO module and nothing of Shoal outside
    itself."""
    checked = 0
    for name, path in modules().items():
        if not name.startswith("shoal.broker.amqp"):
            continue
        checked += 1
        used = top_level_imports(path)
        assert not used & IO_MODULES, f"{name} imports {sorted(used & IO_MODULES)}"
        project = graph(type_checking=True)[name]
        outside = sorted(t for t in project if not t.startswith("shoal.broker.amqp"))
        assert not outside, f"{name} imports {outside}"
    assert checked >= 4


QUEUE_RECORD = re.compile(r"\bL\.(Q|B)_[A-Z_]+|QUEUE_SIZE")


def test_queue_records_are_read_and_written_only_in_shm() -> None:
    """Workers and the broker's processes go through QueueStore (and
    shm/counters.py for observers): a queue's rules live in one place."""
    offenders = []
    checked = 0
    for name, path in modules().items():
        if name.startswith("shoal.shm"):
            continue
        checked += 1
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if QUEUE_RECORD.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert checked >= 100 and offenders == []


def test_the_load_generator_imports_nothing_of_the_broker() -> None:
    """perf/ measures any AMQP broker; it must not lean on Shoal's code."""
    edges = graph(type_checking=True)
    assert sum(1 for name in edges if name.startswith("shoal.perf")) >= LEAST_MODULES["perf"]
    for name, targets in edges.items():
        if name.startswith("shoal.perf"):
            outside = sorted(t for t in targets if not t.startswith("shoal.perf"))
            assert not outside, f"{name} imports {outside}"


def test_the_spark_connector_imports_nothing_of_the_broker() -> None:
    """spark/ is installed into Spark's environment and talks AMQP to a
    broker over the network: it must not lean on the broker's code."""
    edges = graph(type_checking=True)
    assert sum(1 for name in edges if name.startswith("shoal.spark")) >= LEAST_MODULES["spark"]
    for name, targets in edges.items():
        if name.startswith("shoal.spark"):
            outside = sorted(t for t in targets if not t.startswith("shoal.spark"))
            assert not outside, f"{name} imports {outside}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
