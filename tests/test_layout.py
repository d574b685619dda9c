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


BROKER_SUBPACKAGES = (
    "amqp",
    "cluster",
    "management",
    "observe",
    "operate",
    "scheduler",
    "shovel",
    "supervisor",
)


def broker_unit(module: str) -> str:
    """The unit of the broker's layering a module belongs to: its
    subpackage (shoal.broker.cluster), or itself for the modules at the top
    of broker/ (config, ipc, cli...), which each stand alone."""
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "broker" and parts[2] in BROKER_SUBPACKAGES:
        return ".".join(parts[:3])
    return module


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    collapsed: dict[str, set[str]] = {}
    for source, targets in edges.items():
        for target in targets:
            a, b = broker_unit(source), broker_unit(target)
            if a != b:
                collapsed.setdefault(a, set()).add(b)
    return collapsed


def test_the_broker_packages_import_one_way() -> None:
    """No loop between the broker's packages, lazy imports in functions
    included: metrics (observe) only read, the verbs that write (operate)
    sit above the cluster, which sits above the supervisor, the management
    API and the metrics (issue 39: observe -> cluster -> supervisor ->
    management -> observe was a loop)."""
    collapsed = package_edges(graph(type_checking=False))
    assert {"shoal.broker.operate", "shoal.broker.cluster"} <= set(collapsed)
    assert cycles(collapsed) == []


def test_the_package_check_sees_a_loop_between_packages() -> None:
    edges = {
        "shoal.broker.observe.status": {"shoal.broker.cluster.verbs"},
        "shoal.broker.cluster.node": {"shoal.broker.supervisor.main"},
        "shoal.broker.supervisor.main": {"shoal.broker.observe.metrics"},
    }
    assert cycles(package_edges(edges)) == [
        ["shoal.broker.cluster", "shoal.broker.observe", "shoal.broker.supervisor"]
    ]


def duplicate_file_names(paths: list[Path]) -> dict[str, list[str]]:
    """File names (other than __init__.py) that more than one module has."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    return {name: sorted(where) for name, where in by_name.items() if len(where) > 1}


BROKER_PACKAGES = ("broker", "workers", "shm", "store")


def test_no_two_modules_share_a_file_name() -> None:
    """A file name says which module it is without its directory: a reader
    who meets "streams.py" or "main.py" in a log, a traceback or a comment
    does not have to guess among four (issue 39: the layers' modules are
    named for what they hold, e.g. stream_arguments, stream_io,
    stream_words, stream_segments)."""
    paths = list(modules().values())
    broker = [p for p in paths if p.relative_to(ROOT).parts[0] in BROKER_PACKAGES]
    assert len(broker) > 150, "the walk found too few of the broker's modules"
    assert duplicate_file_names(broker) == {}
    # The load generator and the Spark connector are programs of their own
    # (they import nothing of the broker): each is checked by itself.
    for tool in ("perf", "spark"):
        assert (
            duplicate_file_names([p for p in paths if p.relative_to(ROOT).parts[0] == tool]) == {}
        )


def test_the_file_name_check_finds_a_repeated_name() -> None:
    paths = [ROOT / "shm" / "streams.py", ROOT / "store" / "streams.py", ROOT / "shm" / "x.py"]
    assert duplicate_file_names(paths) == {"streams.py": ["shm/streams.py", "store/streams.py"]}


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
    imports = graph(type_checking=True)  # (once: it parses every module)
    for name, path in modules().items():
        if not name.startswith("shoal.broker.amqp"):
            continue
        checked += 1
        used = top_level_imports(path)
        assert not used & IO_MODULES, f"{name} imports {sorted(used & IO_MODULES)}"
        project = imports[name]
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
    above it, queues are read through SharedQueues, its QueueTable and QueueCatalog, and
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


# shm/arena.py's names for a record's offsets, flags and sizes (the layout's,
# re-exported for the hot paths).
RECORD_LAYOUT_NAMES = {
    "RECORD_START",
    "FLAGS_BYTE",
    "TIMED",
    "TAGGED",
    "TAG_SIZE",
    "TIME_SIZE",
}
# Every read and write of a message record is in shm/ (issue 39): none is
# left outside it, and a new one fails here.
RAW_RECORD_ACCESS_LEFT: dict[str, dict[str, int]] = {}


def raw_record_access(path: Path) -> dict[str, int]:
    """How often `path` reaches into the segment's bytes (`seg.buf`),
    imports a record's layout names from shm/arena.py, or allocates in an
    arena (`arena.alloc`)."""
    tree = ast.parse(path.read_text())
    counts = {"seg.buf": 0, "layout names": 0, "arena.alloc": 0}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "buf":
            if ast.unparse(node.value).split(".")[-1] == "seg":
                counts["seg.buf"] += 1
        elif isinstance(node, ast.Attribute) and node.attr == "alloc":
            if ast.unparse(node.value).split(".")[-1] == "arena":
                counts["arena.alloc"] += 1
        elif isinstance(node, ast.ImportFrom) and node.module == "shoal.shm.arena":
            counts["layout names"] += sum(a.name in RECORD_LAYOUT_NAMES for a in node.names)
    return {kind: n for kind, n in counts.items() if n}


def test_raw_record_access_outside_shm_only_goes_down() -> None:
    found = {}
    for name, path in modules().items():
        if name.startswith("shoal.shm"):
            continue
        counts = raw_record_access(path)
        if counts:
            found[str(path.relative_to(ROOT))] = counts
    assert found == RAW_RECORD_ACCESS_LEFT


def test_the_raw_access_count_sees_each_kind(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from shoal.shm.arena import FLAGS_BYTE, TIMED, Arena\n"
        "def f(ctx, seg):\n"
        "    block = ctx.arena.alloc(8)\n"
        "    return seg.buf[block + FLAGS_BYTE] & TIMED, ctx.seg.buf\n"
    )
    assert raw_record_access(sample) == {"seg.buf": 2, "layout names": 2, "arena.alloc": 1}


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


def reexported_methods(node: ast.ClassDef, known: dict) -> set[str]:
    """Methods of its parts a class hands out as its own: in its __init__,
    `self.name = part.name`, where `part` was made there (`part = Part(...)`
    or `self.part = Part(...)`) and `name` is a method of one of the
    project's classes. A caller then uses it as if the class had it."""
    methods = {  # plain methods of the project's classes (no properties, no Protocols)
        item.name
        for entries in known.values()
        for _module, cls in entries
        if "Protocol" not in {ast.unparse(base) for base in cls.bases}
        for item in cls.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.decorator_list
    }
    found: set[str] = set()
    for item in node.body:
        if not (isinstance(item, ast.FunctionDef) and item.name == "__init__"):
            continue
        assigns = [stmt for stmt in ast.walk(item) if isinstance(stmt, ast.Assign)]
        parts = {  # what __init__ made, `x = Part(...)`, `self.x = x = Part(...)`: its parts
            ast.unparse(target)
            for stmt in assigns
            if isinstance(stmt.value, ast.Call)
            for target in stmt.targets
        }
        for stmt in assigns:
            value = stmt.value
            if not isinstance(value, ast.Attribute) or ast.unparse(value.value) not in parts:
                continue
            for target in stmt.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and ast.unparse(target.value) == "self"
                    and target.attr == value.attr
                    and target.attr in methods
                ):
                    found.add(target.attr)
    return found


def method_names(module: str, node: ast.ClassDef, known: dict, seen: set[int]) -> set[str]:
    """The class's methods and those of its project base classes (mixins
    counted: an object of 9 mixins is one object), by name."""
    if id(node) in seen:
        return set()
    seen.add(id(node))
    names = {
        item.name for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    names |= reexported_methods(node, known)
    for base in node.bases:
        base_name = ast.unparse(base).split(".")[-1].split("[")[0]
        candidates = known.get(base_name, [])
        same = [c for c in candidates if c[0] == module]
        for base_module, base_node in same or candidates[:1]:
            names |= method_names(base_module, base_node, known, seen)
    return names


def test_no_class_has_too_many_methods() -> None:
    """An object of one job: at most MAX_METHODS methods, its base classes'
    (the project's) counted, and the methods of its parts it hands out as
    its own. No exception: a class that needs more holds parts."""
    known = classes()
    assert sum(map(len, known.values())) > 200, "the class walk found too few classes"
    offenders = []
    for name, entries in known.items():
        for module, node in entries:
            count = len(method_names(module, node, known, set()))
            if count > MAX_METHODS:
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


def test_the_method_count_sees_reexported_methods() -> None:
    tree = ast.parse(
        "class Part:\n    def hold(self): ...\n"
        "class Whole:\n"
        "    def __init__(self):\n"
        "        part = Part()\n"
        "        self.hold = part.hold\n"
        "        self.items = part.items\n"
        "    def own(self): ...\n"
    )
    known = {n.name: [("m", n)] for n in tree.body if isinstance(n, ast.ClassDef)}
    assert method_names("m", known["Whole"][0][1], known, set()) == {"__init__", "own", "hold"}


# What writes a file's bytes, its size or its name, or makes them durable.
FILE_WRITES = {
    "fdatasync",
    "fsync",
    "ftruncate",
    "posix_fallocate",
    "pwrite",
    "pwritev",
    "rename",
    "renames",
    "replace",
    "sync_file_range",
    "truncate",
    "write",
    "writev",
}
WRITE_FLAGS = {"O_APPEND", "O_CREAT", "O_RDWR", "O_TRUNC", "O_WRONLY"}
# Modules outside store/ that write files, none of them durable data, each
# with the reason.
NON_DURABLE_WRITERS = {
    "shoal.broker.supervisor.datadir": "the lock file: its holder's pid, read only to name it",
    "shoal.broker.settings": "the runtime directory's settings, remade at every start",
    "shoal.broker.operate.ctl": "`shoal ctl` writes an export to the file its user names",
    "shoal.shm.segment": "the shared-memory segment's file, in the runtime directory",
    "shoal.shm.dedup_cache": "deduplication caches: mapped files (ftruncate sizes them; written "
    "through the mapping, the disk ones msync'd with the message store's syncs)",
    "shoal.spark.classic": "Spark's own checkpoint files, on the Spark side of the connector",
    "shoal.broker.cluster.node": "cluster.json in the runtime directory: a node's view of its "
    "cluster for `shoal status`, rewritten every half second",
    "shoal.shm.lease_cell": "the lease deadline's 8-byte memfd (ftruncate sizes it), "
    "shared with the broker's processes, never on disk",
}


def _writes_mode(mode: ast.expr | None) -> bool:
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) & set("wax+"))
    return True  # a mode computed at runtime: counted as a write


def file_writes(path: Path) -> list[tuple[int, str]]:
    """The calls in `path` that write files: os.<FILE_WRITES> (also
    imported bare from os), os.open with a write flag, open()/os.fdopen/
    io.open in a write mode, Path.write_text/write_bytes."""
    tree = ast.parse(path.read_text())
    from_os = {
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "os"
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module, name = func.value.id, func.attr
        elif isinstance(func, ast.Name):
            module, name = ("os", from_os[func.id]) if func.id in from_os else ("", func.id)
        elif isinstance(func, ast.Attribute):
            module, name = "", func.attr
        else:
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        if module == "os" and name in FILE_WRITES:
            hit = True
        elif module == "os" and name == "open":
            flags = node.args[1] if len(node.args) > 1 else keywords.get("flags")
            hit = flags is not None and any(
                (isinstance(n, ast.Attribute) and n.attr in WRITE_FLAGS)
                or (isinstance(n, ast.Name) and n.id in WRITE_FLAGS)
                for n in ast.walk(flags)
            )
        elif (module, name) in {("", "open"), ("os", "fdopen"), ("io", "open")}:
            hit = _writes_mode(node.args[1] if len(node.args) > 1 else keywords.get("mode"))
        else:
            hit = name in {"write_text", "write_bytes"}
        if hit:
            found.append((node.lineno, ast.unparse(node)[:80]))
    return sorted(found)


def test_the_finder_of_file_writes_finds_each_kind(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import os\nfrom os import fdatasync as sync\n"
        "os.fsync(fd)\nsync(fd)\nos.pwrite(fd, b'', 0)\nos.replace(a, b)\n"
        "os.open(p, os.O_RDWR | os.O_CREAT)\nos.open(p, os.O_RDONLY)\n"
        "open(p, 'ab')\nopen(p, 'rb')\nopen(p)\nos.fdopen(fd, mode)\nq.write_bytes(b'')\n"
    )
    lines = [line for line, _call in file_writes(source)]
    assert lines == [3, 4, 5, 6, 7, 9, 12, 13]


def test_store_is_the_one_owner_of_durable_writes() -> None:
    """Every write of data that outlives the broker (the message store,
    streams, definitions, the epoch, paging files) is store/'s: the workers
    and the scheduler decide what and when, store/ writes, syncs, and
    applies the one rule for a failed write (store/sync.py). Outside store/
    only NON_DURABLE_WRITERS write files."""
    inside: list[str] = []
    outside: dict[str, list[str]] = {}
    for name, path in modules().items():
        writes = [f"{path.relative_to(ROOT)}:{line}: {call}" for line, call in file_writes(path)]
        if name.startswith("shoal.store"):
            inside += writes
        elif writes:
            outside[name] = writes
    assert len(inside) >= 10, inside  # the finder finds what store/ does
    assert any("fdatasync" in w for w in inside) and any("pwrite" in w for w in inside)
    offenders = [w for name, ws in outside.items() if name not in NON_DURABLE_WRITERS for w in ws]
    assert offenders == []
    stale = sorted(set(NON_DURABLE_WRITERS) - set(outside))
    assert stale == [], "allowed writers that no longer write: drop them from the list"


# The worker's composition roots: the process, its shared context, and a
# connection (which makes its channels). Every other part of the worker says
# in a Protocol of its own what it uses of the context (IngestContext,
# PullContext, PublishContext, DeliveryContext...), so that none reaches all.
# The composition roots: the worker process, and a connection (an MQTT one
# makes the AMQP connection it speaks through, workers/mqtt_connection.py;
# a WebSocket one its MqttConnection once upgraded, workers/mqtt_websocket.py).
WORKER_CONTEXT_HOLDERS = {
    "shoal.workers.worker",
    "shoal.workers.connection",
    "shoal.workers.mqtt_connection",
    "shoal.workers.mqtt_websocket",
}


def names_worker_context(path: Path) -> bool:
    """Whether the module imports WorkerContext (for any use, annotations too)."""
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "shoal.workers.context"
        and any(alias.name == "WorkerContext" for alias in node.names)
        for node in ast.walk(tree)
    )


def test_only_the_composition_roots_hold_the_whole_worker_context() -> None:
    holders = {name for name, path in modules().items() if names_worker_context(path)}
    assert holders == WORKER_CONTEXT_HOLDERS


def test_the_context_check_sees_an_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from shoal.workers.context import Requests, WorkerContext\n")
    assert names_worker_context(sample)
    sample.write_text("from shoal.workers.context import Requests\n")
    assert not names_worker_context(sample)


def test_every_package_is_in_the_distribution() -> None:
    """A package folder pyproject.toml does not list is missing from a
    wheel (and so from the Debian package), though an editable install,
    which links the folders, still finds it."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        "shoal." + ".".join(init.parent.relative_to(ROOT).parts)
        for package in ("broker", "workers", "shm", "store", "perf")
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert folders - listed == set()
