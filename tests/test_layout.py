"""The shape of the code, checked with `ast` (no third-party tool): which
package may import which, no import cycles, the segment's layout known only
inside shm/, objects of one job (no class of too many methods), and one owner
of durable writes (docs/ARCHITECTURE.md, "Code layout")."""

from __future__ import annotations

import ast
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


def layout_uses(path: Path) -> list[tuple[int, str]]:
    """Where `path` uses shm/layout.py: an import of it (under any alias)
    or of a name from it, and every attribute read through such an alias."""
    tree = ast.parse(path.read_text())
    aliases: set[str] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "shoal.shm.layout":
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module == "shoal.shm":
            for alias in node.names:
                if alias.name == "layout":
                    aliases.add(alias.asname or "layout")
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "shoal.shm.layout":
                    aliases.add(alias.asname or "shoal.shm.layout")
                    found.append((node.lineno, ast.unparse(node)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in aliases:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_layout_constant_is_used_outside_shm() -> None:
    """Offsets, flags and sizes of the segment (shm/layout.py) stay in shm/:
    above it, queues are read through QueueStore, QueueDirectory and
    shm/counters.py, the process table and the header through
    shm/processes.py (ProcessSlot, Header), a message record through
    shm/arena.py. Whatever the alias (`L.Q_TAIL`, `layout.P_READY`,
    `from shoal.shm.layout import BLOCK_HEADER`)."""
    offenders = []
    checked = 0
    for name, path in modules().items():
        if name.startswith("shoal.shm"):
            continue
        checked += 1
        for number, text in layout_uses(path):
            offenders.append(f"{path.relative_to(ROOT)}:{number}: {text}")
    assert checked >= 100 and offenders == []


def test_the_layout_rule_sees_every_alias(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from shoal.shm import layout as L\n"
        "from shoal.shm.layout import BLOCK_HEADER\n"
        "import shoal.shm.layout\n"
        "x = L.Q_TAIL + shoal.shm.layout.P_READY\n"
    )
    texts = [text for _line, text in layout_uses(sample)]
    assert "L.Q_TAIL" in texts and "shoal.shm.layout.P_READY" in texts
    assert len(texts) == 5


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


MAX_METHODS = 40


def classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of the packages by its name: [(module, node)]."""
    found: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((name, node))
    return found


def method_names(module: str, node: ast.ClassDef, known: dict, seen: set[int]) -> set[str]:
    """The class's methods and those of its project base classes (mixins
    counted: an object of 9 mixins is one object), by name."""
    if id(node) in seen:
        return set()
    seen.add(id(node))
    names = {
        item.name
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for base in node.bases:
        base_name = ast.unparse(base).split(".")[-1].split("[")[0]
        candidates = known.get(base_name, [])
        same = [c for c in candidates if c[0] == module]
        for base_module, base_node in same or candidates[:1]:
            names |= method_names(base_module, base_node, known, seen)
    return names


def test_no_class_has_too_many_methods() -> None:
    """An object of one job: at most MAX_METHODS methods, its base classes'
    (the project's) counted, unless its docstring says why it has "many
    methods" (a protocol's whole surface, say)."""
    known = classes()
    assert sum(map(len, known.values())) > 200, "the class walk found too few classes"
    offenders = []
    for name, entries in known.items():
        for module, node in entries:
            count = len(method_names(module, node, known, set()))
            doc = (ast.get_docstring(node) or "").lower()
            if count > MAX_METHODS and "many methods" not in doc:
                offenders.append(f"{module}.{name}: {count} methods")
    assert offenders == []


def test_the_method_count_sees_mixins() -> None:
    tree = ast.parse(
        "class A:\n    def a(self): ...\n"
        "class B(A):\n    def b(self): ...\n"
        "class C(B):\n    def c(self): ...\n    def a(self): ...\n"
    )
    known = {n.name: [("m", n)] for n in tree.body if isinstance(n, ast.ClassDef)}
    assert method_names("m", known["C"][0][1], known, set()) == {"a", "b", "c"}
