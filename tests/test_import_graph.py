"""The package's import graph, read from the source with ``ast``: no circle among its modules, and its own
modules imported at module top except where ``ALLOWED_IN_FUNCTIONS`` says why.

Every import statement counts, wherever it stands: an ``if TYPE_CHECKING:`` import or one inside a function
still ties the two modules together, it only hides the circle from the interpreter. The stage registry
(``stages/registry.py``) loads stage modules from ``module:name`` strings with ``importlib``, which is no import statement:
that is how stages that call ``run_stage`` themselves (pipeline, scale-search) stay out of a circle with it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

#: Modules whose functions may import the package's own modules, and why.
ALLOWED_IN_FUNCTIONS = {
    "nope_lightning.cli": "the fast-failure path: a mistyped stage or key fails before torch or Lightning load",
}


@dataclass(frozen=True)
class Import:
    """One imported package module: ``importer`` imports ``names`` of ``target`` at ``line``."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int
    in_function: bool


def module_name(path: Path, root: Path) -> str:
    """``root/a/b.py`` -> ``<root name>.a.b``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Collector(ast.NodeVisitor):
    """The imports of the package's modules in one module's tree."""

    def __init__(self, module: str, package: str, modules: set[str]) -> None:
        self.module, self.package, self.modules = module, package, modules
        self.depth = 0  # enclosing functions and classes
        self.found: list[Import] = []

    def _scope(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Import(self, node: ast.Import) -> None:
        self._add(node, {alias.name: [alias.name] for alias in node.names})

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.package.rsplit(".", node.level - 1)[0] if node.level else ""
        base = ".".join(filter(None, [base, node.module]))
        names: dict[str, list[str]] = defaultdict(list)
        for alias in node.names:  # ``from package import module`` imports the module
            submodule = f"{base}.{alias.name}"
            names[submodule if submodule in self.modules else base].append(alias.name)
        self._add(node, names)

    def _add(self, node: ast.stmt, names: dict[str, list[str]]) -> None:
        """One ``Import`` per package module that ``node`` imports (``names``: module -> imported names)."""
        self.found += [Import(self.module, target, tuple(taken), node.lineno, self.depth > 0)
                       for target, taken in names.items() if target in self.modules]


def package_imports(root: Path) -> list[Import]:
    """Every import of one of the package's modules by another, for the package at ``root``."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    found: list[Import] = []
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        collector = _Collector(module, package, set(paths))
        collector.visit(ast.parse(path.read_text(), str(path)))
        found += [i for i in collector.found if i.target != module]
    return found


def circles(found: list[Import]) -> list[list[str]]:
    """The import circles: strongly connected groups of two or more modules (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for i in found:
        graph[i.importer].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def describe_circle(group: list[str], found: list[Import]) -> str:
    """The circle's modules, then each import between them with the names it takes."""
    names: dict[tuple[str, str], set[str]] = defaultdict(set)
    for i in found:
        if i.importer in group and i.target in group:
            names[(i.importer, i.target)].update(i.names)
    edges = [f"  {a} -> {b}: {', '.join(sorted(n))}" for (a, b), n in sorted(names.items())]
    return "\n".join([f"circle: {', '.join(group)}", *edges])


def function_level(found: list[Import]) -> list[Import]:
    """Imports of the package's modules inside functions or classes, outside ``ALLOWED_IN_FUNCTIONS``."""
    return [i for i in found if i.in_function and i.importer not in ALLOWED_IN_FUNCTIONS]


def test_the_package_has_no_import_circle():
    found = package_imports(REPO / "nope_lightning")
    report = [describe_circle(group, found) for group in circles(found)]
    assert not report, "import circles (break them; a TYPE_CHECKING or function-level import hides one):\n" + \
        "\n".join(report)


def test_the_package_imports_its_own_modules_at_module_top():
    late = function_level(package_imports(REPO / "nope_lightning"))
    lines = [f"  {i.importer}:{i.line} imports {i.target} ({', '.join(i.names)})" for i in late]
    assert not lines, "imports of the package's own modules inside functions (move them to the module top; " \
                     "where one avoided a circle, remove the circle):\n" + "\n".join(lines)


def test_the_checks_see_circles_hidden_imports_and_late_imports(tmp_path):
    files = {"__init__.py": "", "a.py": "from pkg.sub import b\n", "sub/__init__.py": "",
             "sub/b.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..a import X\n",
             "c.py": "import pkg.a\n\n\ndef f():\n    from pkg import sub\n    from .sub import b\n",
             "d.py": "from . import c\n"}
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    found = package_imports(tmp_path / "pkg")
    assert circles(found) == [["pkg.a", "pkg.sub.b"]]
    assert describe_circle(["pkg.a", "pkg.sub.b"], found) == ("circle: pkg.a, pkg.sub.b\n"
                                                              "  pkg.a -> pkg.sub.b: b\n"
                                                              "  pkg.sub.b -> pkg.a: X")
    assert [(i.importer, i.target, i.line) for i in function_level(found)] == [("pkg.c", "pkg.sub", 5),
                                                                               ("pkg.c", "pkg.sub.b", 6)]
    assert ("pkg.d", "pkg.c") in {(i.importer, i.target) for i in found}


#: Line budgets: a module past them holds two things and should be split (``stages/`` hold training logic only,
#: so theirs is smaller).
MODULE_LINES, STAGE_LINES = 400, 300


def oversized(package: Path) -> list[str]:
    """``path: lines (budget)`` for every module of ``package`` over its budget."""
    out = []
    for path in sorted(package.rglob("*.py")):
        budget = STAGE_LINES if path.parent.name == "stages" else MODULE_LINES
        if (lines := len(path.read_text().splitlines())) > budget:
            out.append(f"{path.relative_to(package.parent)}: {lines} lines (budget {budget})")
    return out


def test_no_module_outgrows_its_line_budget(tmp_path):
    assert not oversized(REPO / "nope_lightning"), "modules to split:\n" + "\n".join(oversized(REPO / "nope_lightning"))
    (tmp_path / "pkg" / "stages").mkdir(parents=True)
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 401)
    (tmp_path / "pkg" / "ok.py").write_text("x = 1\n" * 400)
    (tmp_path / "pkg" / "stages" / "stage.py").write_text("x = 1\n" * 301)
    assert oversized(tmp_path / "pkg") == ["pkg/big.py: 401 lines (budget 400)",
                                           "pkg/stages/stage.py: 301 lines (budget 300)"]


#: The package's floors, lowest first: each entry is a folder (a subpackage; ``cli`` is the one module at the root),
#: and a module may import its own floor's modules and lower ones, never a higher floor's. Every folder sits on
#: exactly one floor, so a new folder is placed on purpose; within a floor, folders may import each other as long as
#: no circle forms (the circle test above).
LAYERS: tuple[tuple[str, ...], ...] = (
    # 1. the synthetic tasks' generators: pure Python, nothing else of the package
    ("nope_lightning.synthetic",),
    # 2. declarations: the typed configs and the papers' numbers and claims they name
    ("nope_lightning.config",),
    # 3. what runs leave and use: typed result files and run identity, numbers from sums, the stores and plumbing
    ("nope_lightning.results", "nope_lightning.numerics", "nope_lightning.runtime"),
    # 4. building blocks: the model (and a trained model as files), the data
    ("nope_lightning.model", "nope_lightning.data"),
    # 5. working with models: training, measurement, the study's analysis
    ("nope_lightning.training", "nope_lightning.eval", "nope_lightning.analysis"),
    # 6. the stages and their registry
    ("nope_lightning.stages",),
    # 7. orchestration: experiment files expanded, dry-run, run; the command line
    ("nope_lightning.pipeline", "nope_lightning.cli"),
)


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The floor (0 = lowest) of the entry that is ``module`` or holds it; None when no entry does."""
    for number, entries in enumerate(layers):
        if any(module == entry or module.startswith(entry + ".") for entry in entries):
            return number
    return None


def test_the_floors_name_every_folder_once_and_the_root_holds_only_the_command_line():
    root = REPO / "nope_lightning"
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "cli.py"], \
        "loose modules at the package root (move them into the folder that says what they are)"
    entries = [entry for floor in LAYERS for entry in floor]
    folders = {f"nope_lightning.{p.parent.name}" for p in root.glob("*/__init__.py")}
    assert len(entries) == len(set(entries)) and set(entries) == folders | {"nope_lightning.cli"}


def upward(found: list[Import], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """``importer (layer) -> target (layer)`` for every import that points from a lower layer to a higher one."""
    return sorted({f"{i.importer} ({layer_of(i.importer, layers) + 1}) -> {i.target} ({layer_of(i.target, layers) + 1})"
                   for i in found if layer_of(i.importer, layers) < layer_of(i.target, layers)})


def test_every_module_sits_in_a_layer_and_imports_only_its_own_or_lower_layers():
    root = REPO / "nope_lightning"
    modules = [module_name(path, root) for path in sorted(root.rglob("*.py"))]
    unplaced = [m for m in modules if m != "nope_lightning" and layer_of(m) is None]
    assert not unplaced, "modules in no layer (add them to LAYERS):\n" + "\n".join(unplaced)
    arrows = upward(package_imports(root))
    assert not arrows, "imports from a lower layer to a higher one:\n" + "\n".join(arrows)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    files = {"__init__.py": "", "low.py": "from pkg import high\n", "high.py": "from pkg import low\n",
             "mid.py": "from pkg import low\n"}
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    layers = (("pkg.low",), ("pkg.mid",), ("pkg.high",))
    assert layer_of("pkg.mid", layers) == 1 and layer_of("pkg.other", layers) is None
    assert upward(package_imports(tmp_path / "pkg"), layers) == ["pkg.low (1) -> pkg.high (3)"]


#: Inside ``analysis/``, one subfolder per paper (``lengthgen``: paper 001 and the hybrids; ``synthetic``: paper
#: 002) and, in the folder itself, what both papers' reports use. A shared module imports no paper's module, and one
#: paper's modules import none of the other's, so either paper's analysis can change without touching the other.
ANALYSIS, PAPER_ROOMS = "nope_lightning.analysis", ("lengthgen", "synthetic")


def analysis_room(module: str, analysis: str = ANALYSIS, rooms: tuple[str, ...] = PAPER_ROOMS) -> str | None:
    """The paper subfolder ``module`` sits in, '' for a shared analysis module, None outside ``analysis``."""
    if module != analysis and not module.startswith(analysis + "."):
        return None
    first = module[len(analysis) + 1:].split(".")[0]
    return first if first in rooms else ""


def crossings(found: list[Import], analysis: str = ANALYSIS, rooms: tuple[str, ...] = PAPER_ROOMS) -> list[str]:
    """``importer -> target`` for every import of a paper's analysis module by a shared one or by the other
    paper's."""
    return sorted({f"{i.importer} -> {i.target}" for i in found
                   if (source := analysis_room(i.importer, analysis, rooms)) is not None
                   and (room := analysis_room(i.target, analysis, rooms)) and source != room})


def test_each_paper_has_its_analysis_room_and_the_shared_modules_import_neither():
    root = REPO / "nope_lightning" / "analysis"
    assert sorted(p.parent.name for p in root.glob("*/__init__.py")) == sorted(PAPER_ROOMS), \
        "analysis subfolders and PAPER_ROOMS differ (a new subfolder is a paper's room: add it)"
    arrows = crossings(package_imports(REPO / "nope_lightning"))
    assert not arrows, "imports of a paper's analysis from a shared module or the other paper's:\n" + "\n".join(arrows)


def test_the_room_check_sees_a_shared_module_or_the_other_paper_importing_a_paper(tmp_path):
    files = {"__init__.py": "", "an/__init__.py": "", "an/shared.py": "from pkg.an.one import a\n",
             "an/one/__init__.py": "", "an/one/a.py": "from pkg.an import shared\n",
             "an/two/__init__.py": "", "an/two/b.py": "from pkg.an.one import a\nfrom pkg.an import shared\n",
             "user.py": "from pkg.an.two import b\n"}
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    rooms = ("one", "two")
    assert [analysis_room(m, "pkg.an", rooms) for m in ("pkg.an.one.a", "pkg.an.shared", "pkg.an", "pkg.user")] == \
        ["one", "", "", None]
    assert crossings(package_imports(tmp_path / "pkg"), "pkg.an", rooms) == ["pkg.an.shared -> pkg.an.one.a",
                                                                             "pkg.an.two.b -> pkg.an.one.a"]
