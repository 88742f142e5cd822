"""The architecture as the folders tell it: no import cycle, a Flower-free science core layered
by concept, configuration validation that loads no heavy library, and no module over
:data:`MAX_LINES` lines."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> the import name it installs as (pyproject.toml's package-dir).
PACKAGES = {
    "fedlmc": "fedlmc",
    "strategies": "fedlmc.strategies",
    "simulations": "fedlmc.simulations",
}
APPS = ("fedlmc.strategies", "fedlmc.simulations")
# The science core's layers, lowest first: a module may import its own layer and those below.
LAYERS = (
    ("fedlmc", "fedlmc._lazy", "fedlmc._app_folders", "fedlmc.registry", "fedlmc.io")
    + ("fedlmc.evaluation", "fedlmc.averaging", "fedlmc.capture", "fedlmc.columns")
    + ("fedlmc.column_schema", "fedlmc.columns_metrics", "fedlmc.columns_mechanism"),
    ("fedlmc.data",),
    ("fedlmc.permutation",),
    ("fedlmc.models", "fedlmc.train"),
    ("fedlmc.merging",),
    ("fedlmc.analysis",),
    ("fedlmc.study",),
)
# The Flower side's layers, lowest first (simulations/__init__.py says why): the ServerApp
# writes the records and the engine runs the ServerApp, so the records sit below the app and the
# run drivers above the engine; the report and the trackers only read the records.
SIMULATION_LAYERS = (
    ("fedlmc.simulations.config",),
    ("fedlmc.simulations.records",),
    ("fedlmc.simulations.task",),
    ("fedlmc.simulations.private",),
    ("fedlmc.simulations.client_app", "fedlmc.simulations.server_app"),
    ("fedlmc.simulations.engine",),
    ("fedlmc.simulations.runs",),
    ("fedlmc.simulations.report", "fedlmc.simulations.tracking"),
    ("fedlmc.simulations", "fedlmc.simulations.cli"),
)
MAX_TOP_LEVEL_MODULES = 8
MAX_LINES = 600
"""The most lines a Python module of the project may have."""
LINE_LIMITED = ("fedlmc", "strategies", "simulations", "tests", "benchmarks", "docs", "examples")
"""The folders whose every ``.py`` file is held to :data:`MAX_LINES`."""


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per test process (the checks below only read it)."""
    return ast.parse(path.read_text(), filename=str(path))


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [PACKAGES[folder], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every project module ``path`` imports, at module level or inside functions."""
    found: set[str] = set()
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = node.module if node.level == 0 else _relative(package, node)
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def _relative(package: str, node: ast.ImportFrom) -> str:
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}"


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")}
    known = set(files)
    return {name: imported_modules(path, known) - {name} for name, path in files.items()}


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int:
    """The index in ``layers`` of the longest prefix naming ``module``'s layer."""
    best = max(
        (
            prefix
            for layer in layers
            for prefix in layer
            if module == prefix or module.startswith(prefix + ".")
        ),
        key=len,
    )
    return next(i for i, layer in enumerate(layers) if best in layer)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_project_has_no_import_cycle():
    graph = import_graph()
    assert "fedlmc.simulations.runs.federation" in graph and "fedlmc.merging.methods" in graph
    assert find_cycle(graph) is None


def test_the_science_core_imports_no_framework():
    for path in (ROOT / "fedlmc").rglob("*.py"):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in ("flwr", "ray", "simulations", "strategies"), (path, name)
                assert not name.startswith(APPS), (path, name)


def test_the_science_core_imports_only_its_own_layer_and_those_below():
    graph = import_graph()
    science = {name: deps for name, deps in graph.items() if not name.startswith(APPS)}
    assert {"fedlmc.data.catalog", "fedlmc.permutation.tracing", "fedlmc.study.compare"} <= set(
        science
    )
    upward = [
        (name, dep)
        for name, deps in science.items()
        for dep in deps
        if layer_of(dep) > layer_of(name)
    ]
    assert upward == []


def test_layer_check_sees_an_upward_import():
    assert layer_of("fedlmc.merging.repair") > layer_of("fedlmc.averaging")
    assert layer_of("fedlmc.analysis.paths") > layer_of("fedlmc.merging.repair")
    assert layer_of("fedlmc.permutation.matching") < layer_of("fedlmc.models.classifiers")


def test_the_flower_side_imports_only_its_own_layer_and_those_below():
    graph = import_graph()
    flower = {n: deps for n, deps in graph.items() if n.startswith("fedlmc.simulations")}
    assert {"fedlmc.simulations.report.build", "fedlmc.simulations.engine.cells"} <= set(flower)
    upward = [
        (name, dep)
        for name, deps in flower.items()
        for dep in deps
        if dep.startswith("fedlmc.simulations")
        and layer_of(dep, SIMULATION_LAYERS) > layer_of(name, SIMULATION_LAYERS)
    ]
    assert upward == []


def test_flower_layer_check_sees_an_upward_import():
    below = layer_of("fedlmc.simulations.records.results_file", SIMULATION_LAYERS)
    assert below < layer_of("fedlmc.simulations.server_app", SIMULATION_LAYERS)
    assert layer_of("fedlmc.simulations.engine.cells", SIMULATION_LAYERS) < layer_of(
        "fedlmc.simulations.runs.sweep", SIMULATION_LAYERS
    )
    assert layer_of("fedlmc.simulations.report.data", SIMULATION_LAYERS) > layer_of(
        "fedlmc.simulations.runs.sweep", SIMULATION_LAYERS
    )


def test_the_flower_side_is_folders_with_a_short_top_level():
    top = sorted(p.name for p in (ROOT / "simulations").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    for init in (ROOT / "simulations").glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 80, f"{init} says in its docstring what it holds"


def module_under_test(test_file: Path) -> Path | None:
    """The module or package a test file is named after: ``tests/<folder>/.../test_<name>.py``
    tests ``<folder>/.../<prefix>`` for the longest ``_``-prefix of ``<name>`` that is a module
    (``.py``) or a package there (``test_paths_temperature`` -> ``paths.py``); ``None`` when none
    is. ``tests/project/`` holds the tests of the project as a whole."""
    folder, *middle = test_file.relative_to(ROOT / "tests").parent.parts
    parts = test_file.stem.removeprefix("test_").split("_")
    for end in range(len(parts), 0, -1):
        base = ROOT / folder / Path(*middle) / "_".join(parts[:end])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


def test_every_test_file_is_named_after_the_module_it_tests():
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(files) > 50
    unnamed = [
        str(f.relative_to(ROOT))
        for f in files
        if f.parent.relative_to(ROOT / "tests").parts[:1] != ("project",)
        and (f.parent == ROOT / "tests" or module_under_test(f) is None)
    ]
    assert unnamed == []
    no_docstring = [str(f) for f in files if not ast.get_docstring(parsed(f))]
    assert no_docstring == []


def test_test_names_resolve_to_their_modules():
    tests = ROOT / "tests"
    assert module_under_test(tests / "fedlmc/analysis/test_paths_temperature.py") == (
        ROOT / "fedlmc/analysis/paths.py"
    )
    assert module_under_test(tests / "simulations/test_tracking.py") == (
        ROOT / "simulations/tracking/__init__.py"
    )
    assert module_under_test(tests / "simulations/engine/test_nothing_here.py") is None


PROCESS_PATTERNS = (
    "subprocess.",
    "Popen(",
    "run_federation(",
    "run_federation_outcome(",
    "run_cells(",
    "flower-superlink",
    "ray.init(",
)


LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # a source line with its end


def segment(lines: list[str], node: ast.AST) -> str:
    """``ast.get_source_segment`` on the source split once into ``lines`` (``LINE.findall``):
    ``ast`` splits the whole source again on every call (most of this module's time)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    start, end = node.col_offset, node.end_col_offset  # UTF-8 byte offsets
    if first == last:
        return lines[first].encode()[start:end].decode()
    head = lines[first].encode()[start:].decode()
    return "".join([head, *lines[first + 1 : last], lines[last].encode()[:end].decode()])


def test_segment_is_what_ast_gives():
    source = 'x = 1\r\ndef f(a="\u00e9",\n  b=2):  # note\n    return a\n\n@deco(1)\ndef g(): pass'
    nodes = [n for n in ast.walk(ast.parse(source)) if hasattr(n, "end_col_offset")]
    assert len(nodes) > 10
    for node in nodes:
        assert segment(LINE.findall(source), node) == ast.get_source_segment(source, node)


def _is_slow(lines: list[str], node: ast.FunctionDef) -> bool:
    return any("slow" in segment(lines, d) for d in node.decorator_list)


def _starts_directly(body: str) -> bool:
    """A pattern of :data:`PROCESS_PATTERNS`, or a sweep on the engine (``run_sweep`` without a
    ``runner``, which would run the cells in-process)."""
    if any(p in body for p in PROCESS_PATTERNS):
        return True
    calls = ast.walk(ast.parse(textwrap.dedent(body))) if "run_sweep" in body else ()
    return any(
        isinstance(call, ast.Call)
        and getattr(call.func, "id", getattr(call.func, "attr", "")) == "run_sweep"
        and not any(k.arg == "runner" for k in call.keywords)
        for call in calls
    )


Helper = tuple[Path, str]


def _test_module_file(module: str) -> Path | None:
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    return path if module.startswith("tests.") and path.exists() else None


@functools.cache
def _helpers(path: Path) -> tuple[dict[str, Helper], dict[str, tuple[str, set[str]]]]:
    """What the names of ``path`` refer to (its own functions, names imported from other test
    files, the conftest's fixtures) and, per own non-test function, its source and the names
    it uses."""
    source = path.read_text()
    tree, lines = parsed(path), LINE.findall(source)
    refers: dict[str, Helper] = {}
    conftest = ROOT / "tests" / "conftest.py"
    if path != conftest:
        for node in parsed(conftest).body:
            if isinstance(node, ast.FunctionDef):
                refers[node.name] = (conftest, node.name)
    own: dict[str, tuple[str, set[str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if (other := _test_module_file(node.module)) is not None:
                for alias in node.names:
                    refers[alias.asname or alias.name] = (other, alias.name)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test"):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {a.arg for a in node.args.args}
            own[node.name] = (segment(lines, node), names)
            refers[node.name] = (path, node.name)
    return refers, own


def process_starters(files: list[Path]) -> set[Helper]:
    """The test files' helper functions and fixtures, as ``(file, name)``, that start Ray,
    Flower or a subprocess, directly or through another such helper (names resolved per file:
    its own functions, what it imports from other test files, the conftest's fixtures)."""
    table = {path: _helpers(path) for path in files}
    starters = {
        (path, name)
        for path, (_, own) in table.items()
        for name, (body, _) in own.items()
        if _starts_directly(body)
    }
    while True:
        more = {
            (path, name)
            for path, (refers, own) in table.items()
            for name, (_, used) in own.items()
            if (path, name) not in starters
            and any(refers.get(u) in starters for u in used if u != name)
        }
        if not more:
            return starters
        starters |= more


def unmarked_process_tests(path: Path, starters: set[Helper]) -> list[str]:
    """The tests of ``path`` that start Ray, Flower or a subprocess (directly, or through a
    helper or fixture of :func:`process_starters`) without the ``slow`` mark."""
    source = path.read_text()
    if re.search(r"^pytestmark = .*slow", source, re.M):
        return []
    refers, _ = _helpers(path)
    found, lines = [], LINE.findall(source)
    for node in parsed(path).body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
            continue
        if _is_slow(lines, node):
            continue
        body = segment(lines, node)
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        used |= {a.arg for a in node.args.args}
        if _starts_directly(body) or any(refers.get(u) in starters for u in used):
            found.append(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def test_tests_that_start_processes_are_marked_slow():
    files = sorted((ROOT / "tests").rglob("*.py"))
    starters = process_starters(files)
    assert (ROOT / "tests/simulations/runs/test_sweep.py", "shared_sweep") in starters
    unmarked = [name for path in files for name in unmarked_process_tests(path, starters)]
    assert unmarked == []


OTHER_DOCSTRING_STYLES = re.compile(
    r"^\s*(Parameters|Returns|Raises|Yields|Attributes)\n\s*-{3,}\s*$"  # NumPy
    r"|^\s*(Args|Arguments|Returns|Raises|Yields|Attributes):\s*$",  # Google
    re.M,
)


def docstrings_in_another_style(folders: tuple[str, ...]) -> list[str]:
    """``path:object`` of every docstring with a NumPy or Google section (the project writes
    Sphinx fields, ``:param name:``, as ``mkdocs.yml``'s ``docstring_style: sphinx`` reads)."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(parsed(path)):
                if not isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                ):
                    continue
                doc = ast.get_docstring(node, clean=False) or ""
                if OTHER_DOCSTRING_STYLES.search(doc):
                    found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}")
    return found


def test_docstrings_are_written_in_one_style():
    assert "docstring_style: sphinx" in (ROOT / "mkdocs.yml").read_text()
    assert docstrings_in_another_style(("fedlmc", "strategies", "simulations")) == []
    assert OTHER_DOCSTRING_STYLES.search("x\n\n    Parameters\n    ----------\n    a : int\n")
    assert OTHER_DOCSTRING_STYLES.search("x\n\n    Args:\n        a: the a\n")
    assert not OTHER_DOCSTRING_STYLES.search("x\n\n    :param a: the a\n")


def test_strategies_do_not_import_the_simulations():
    graph = import_graph()
    assert not [
        (name, dep)
        for name, deps in graph.items()
        if name.startswith("fedlmc.strategies")
        for dep in deps
        if dep.startswith("fedlmc.simulations")
    ]


def test_run_config_names_live_outside_the_science_core():
    text = "\n".join(p.read_text() for p in (ROOT / "fedlmc").rglob("*.py"))
    for word in ("run_config", "RUN_SCHEMA", "out-dir", "num-gpus", "inject-failure"):
        assert word not in text, word


@pytest.mark.parametrize(
    "code",
    [
        "from fedlmc.simulations.config import load_sweep_config, expand_grid;"
        "expand_grid(load_sweep_config('configs/quick.toml'))",
        "from fedlmc.simulations.cli import main; main(['validate', 'configs/mnist_mlp.toml'])",
        "from fedlmc.simulations.config.tables import keys_table, methods_table; keys_table()",
    ],
)
@pytest.mark.slow
def test_validating_a_sweep_file_loads_no_heavy_library(code: str):
    probe = (
        f"{code}\nimport sys\n"
        "print(sorted(m for m in ('torch', 'scipy', 'pandas', 'flwr', 'ray') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_simulations_exports_run_federation_lazily():
    probe = (
        "import sys, simulations\n"
        "assert 'flwr' not in sys.modules and 'torch' not in sys.modules\n"
        "from fedlmc.simulations import run_federation, run_sweep\n"
        "print(run_federation.__module__, run_sweep.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [
        "fedlmc.simulations.runs.federation",
        "fedlmc.simulations.runs.sweep",
    ]
    import fedlmc.simulations

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fedlmc.simulations.nothing  # noqa: B018


def lazy_packages() -> list[str]:
    return ["fedlmc"] + sorted(
        module_name(init)
        for init in (ROOT / "fedlmc").rglob("__init__.py")
        if "lazy_exports" in init.read_text() and init.parent != ROOT / "fedlmc"
    )


def test_every_short_path_names_what_its_module_defines():
    import importlib
    import inspect

    packages = lazy_packages()
    assert {"fedlmc", "fedlmc.data", "fedlmc.permutation", "fedlmc.study"} <= set(packages)
    for package in packages:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            assert not isinstance(value, type(module)), (package, name, "is a module")
            if inspect.isfunction(value) or inspect.isclass(value):
                assert value.__module__.startswith("fedlmc."), (package, name, value.__module__)


@pytest.mark.slow
def test_importing_fedlmc_and_its_packages_loads_no_heavy_library():
    probe = (
        f"import {', '.join(lazy_packages())}, fedlmc.data.catalog, fedlmc.models.registry, sys\n"
        "print(sorted(m for m in ('torch', 'scipy', 'pandas', 'flwr', 'ray') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def long_modules(root: Path, folders: tuple[str, ...], limit: int) -> list[tuple[str, int]]:
    """``(path, lines)`` of every ``.py`` file under ``root/folder`` longer than ``limit`` lines."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            count = len(path.read_text().splitlines())
            if count > limit:
                found.append((str(path.relative_to(root)), count))
    return found


def test_no_module_is_over_the_line_limit():
    assert long_modules(ROOT, LINE_LIMITED, MAX_LINES) == []


def test_line_limit_check_sees_a_long_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 600)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 601)
    assert long_modules(tmp_path, ("pkg",), 600) == [("pkg/long.py", 601)]


MAX_FUNCTION_LINES = 80
"""The most lines a function of the package may have, from ``def`` to its last line."""
LONG_FUNCTIONS_ALLOWED = {
    # Declarative tables: one entry per run-config key, read as a table, not as logic.
    "simulations/config/keys.py:declared_keys",
    "simulations/config/field_keys.py:field_method_keys",
}
"""``path:qualified name`` of the functions allowed over :data:`MAX_FUNCTION_LINES`."""


def long_functions(root: Path, folders: tuple[str, ...], limit: int) -> dict[str, int]:
    """``{"path:Class.function": lines}`` of every function (methods and nested functions
    included) under ``root/folder`` longer than ``limit`` lines."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}."
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found[f"{path}:{name[:-1]}"] = lines
            visit(child, path, name)

    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            visit(parsed(path), str(path.relative_to(root)), "")
    return found


def test_no_function_is_over_the_line_limit_but_the_declarative_tables():
    folders = ("fedlmc", "strategies", "simulations")
    everything = long_functions(ROOT, folders, 0)  # every function, with its lines
    long = {name: n for name, n in everything.items() if n > MAX_FUNCTION_LINES}
    assert {name: n for name, n in long.items() if name not in LONG_FUNCTIONS_ALLOWED} == {}
    assert LONG_FUNCTIONS_ALLOWED <= set(everything)  # no entry for a function that is gone


def test_function_limit_check_sees_a_long_method_and_a_nested_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    body, deeper = "    x = 1\n", "        x = 1\n"
    (tmp_path / "pkg" / "mod.py").write_text(
        "def short():\n"
        + body * 79
        + "class C:\n    def long(self):\n"
        + deeper * 80
        + "def outer():\n    def inner():\n"
        + deeper * 80
        + body
    )
    assert long_functions(tmp_path, ("pkg",), 80) == {
        "pkg/mod.py:C.long": 81,
        "pkg/mod.py:outer": 83,
        "pkg/mod.py:outer.inner": 81,
    }
