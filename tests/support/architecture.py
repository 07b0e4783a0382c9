"""The package's shape, measured from its source: the figures and import arrows of
docs/architecture.md's "The package measured" (``scripts/architecture.py`` prints them,
``tests/test_architecture.py`` checks the doc and the rules against them).

Read with ``ast`` only, nothing imported: a module's imports are every ``import`` and
``from ... import`` of ``miles_nemogym`` anywhere in it (function-level ones included, so a
lazy import counts like any other); importing ``a.b.c`` also imports the packages ``a`` and
``a.b``. The runtime is what Miles imports (``HOOKS``) and everything those import; the
tools are the rest.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "miles_nemogym"
HOOKS = tuple(f"{PACKAGE}.{name}" for name in ("agent", "groups", "buffer", "metrics"))
"""The modules Miles imports by the dotted paths users name in its flags."""


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: set[str] = field(default_factory=set)
    names: set[tuple[str, str]] = field(default_factory=set)
    """(module, name) of every ``from module import name`` of a package module's name."""
    public: list[str] = field(default_factory=list)
    """Its public names: ``__all__`` where it declares one, else its top-level names without ``_``."""
    declares_all: bool = False

    @property
    def private(self) -> bool:
        return any(part.startswith("_") and part != "__init__" for part in self.name.split("."))


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_names(tree: ast.Module) -> tuple[list[str], bool]:
    names: list[str] = []
    declared: list[str] | None = None
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name):
                if target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):  # type: ignore[union-attr]
                    declared = [str(e.value) for e in node.value.elts if isinstance(e, ast.Constant)]  # type: ignore[union-attr]
                else:
                    names.append(target.id)
    if declared is not None:
        return declared, True
    return [n for n in names if not n.startswith("_")], False


def read_package(root: Path) -> dict[str, Module]:
    """Every module of ``root/src/miles_nemogym`` with its package imports and public names."""
    src = root / "src"
    modules: dict[str, Module] = {}
    trees: dict[str, ast.Module] = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        name = _module_name(path, src)
        text = path.read_text(encoding="utf-8")
        trees[name] = tree = ast.parse(text)
        public, declares_all = _top_level_names(tree)
        modules[name] = Module(name, path, len(text.splitlines()), public=public, declares_all=declares_all)

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for name, tree in trees.items():
        module = modules[name]
        package = name if module.path.name == "__init__.py" else name.rpartition(".")[0]
        bound: dict[str, str] = {}  # a local name bound to a package module (``... import x as fk``)
        for node in ast.walk(tree):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, alias.asname) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [(f"{source}.{alias.name}", alias.asname or alias.name) for alias in node.names]
            for target, local in targets:
                if target.startswith(PACKAGE + ".") or target == PACKAGE:
                    found = resolve(target)
                    if found is not None and found != name:
                        module.imports.add(found)
                        if isinstance(node, ast.ImportFrom) and found != target:  # a name, not a module
                            module.names.add((found, target.rpartition(".")[2]))
                        elif found == target and local is not None:
                            bound[local] = found
        for node in ast.walk(tree):  # ``fk.AGENT_TIMEOUT``: a name used through its module
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                other = bound[node.value.id]
                if f"{other}.{node.attr}" not in modules:
                    module.names.add((other, node.attr))
    return modules


def closure(modules: dict[str, Module], starts: Iterable[str]) -> set[str]:
    """The modules importing ``starts`` loads (their packages' ``__init__`` included)."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:k]) for k in range(1, len(parts))]
        todo += modules[name].imports
    return seen


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``edges``: each strongly connected set of more than one node, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def unit(name: str) -> str:
    """The room a module belongs to: its subpackage (``episode``, ``gym``, ...) or, for a
    top-level module, the module itself."""
    return name.split(".")[1] if name.count(".") >= 1 else name


@dataclass
class Shape:
    modules: dict[str, Module]
    runtime: set[str]

    @property
    def tools(self) -> set[str]:
        return set(self.modules) - self.runtime

    def lines(self, names: Iterable[str]) -> int:
        return sum(self.modules[n].lines for n in names)

    def public_names(self, names: Iterable[str]) -> int:
        return sum(len(self.modules[n].public) for n in names if not self.modules[n].private)

    def module_cycles(self) -> list[list[str]]:
        return cycles({name: module.imports for name, module in self.modules.items()})

    def unit_arrows(self) -> dict[str, set[str]]:
        arrows: dict[str, set[str]] = {}
        for name, module in self.modules.items():
            if name == PACKAGE:
                continue
            for other in module.imports:
                if other != PACKAGE and unit(other) != unit(name):
                    arrows.setdefault(unit(name), set()).add(unit(other))
        return arrows

    def unit_cycles(self) -> list[list[str]]:
        return cycles(self.unit_arrows())

    def room(self, name: str) -> str:
        """Whose internals a module may use: the runtime is one room (its modules share what
        their ``__all__`` leaves out); a tool's room is its ``unit``."""
        return "runtime" if name in self.runtime else unit(name)

    def crossings(self) -> list[str]:
        """Uses across rooms of what is not the other room's API: a private module (``_x``), or
        a name its module's ``__all__`` leaves out (imported, or read through its module).
        Within a room, modules share their internals."""
        found = []
        for name, module in self.modules.items():
            for other in module.imports:
                if self.room(other) != self.room(name) and self.modules[other].private:
                    found.append(f"{name} -> {other}")
            for other, imported in module.names:
                target = self.modules[other]
                if self.room(other) != self.room(name) and target.declares_all and imported not in target.public:
                    found.append(f"{name} -> {other}.{imported}")
        return sorted(found)

    def runtime_importing_tools(self) -> list[str]:
        return sorted(f"{n} -> {o}" for n in self.runtime for o in self.modules[n].imports if o not in self.runtime)


def measure(root: Path) -> Shape:
    modules = read_package(root)
    return Shape(modules, closure(modules, HOOKS))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def figures_table(shape: Shape) -> str:
    runtime, tools = sorted(shape.runtime), sorted(shape.tools)
    files = [n for n in shape.modules]
    rows = [
        ["", "modules", "lines", "public names"],
        ["the package (`src/`)", str(len(files)), str(shape.lines(files)), str(shape.public_names(files))],
        ["the runtime (the hooks and what they import)", str(len(runtime)), str(shape.lines(runtime)),
         str(shape.public_names(runtime))],
        ["the tools (everything else)", str(len(tools)), str(shape.lines(tools)), str(shape.public_names(tools))],
    ]  # fmt: skip
    declared = sum(1 for m in shape.modules.values() if m.declares_all)
    lines = [_row(rows[0]), _row(["---"] * 4), *(_row(r) for r in rows[1:])]
    lines.append("")
    lines.append(
        f"Modules declaring `__all__`: {declared} of {len(files)}. Import cycles between modules: "
        f"{len(shape.module_cycles())}; between rooms: {len(shape.unit_cycles())}. Runtime modules "
        f"importing a tool: {len(shape.runtime_importing_tools())}. Imports across rooms of a private "
        f"module or of a name outside `__all__`: {len(shape.crossings())}."
    )
    return "\n".join(lines) + "\n"


def arrows_text(shape: Shape) -> str:
    """Each room and the rooms it imports, runtime rooms first."""
    arrows = shape.unit_arrows()
    kinds: dict[str, set[str]] = {}
    for name in shape.modules:
        if name != PACKAGE:
            kinds.setdefault(unit(name), set()).add("runtime" if name in shape.runtime else "tool")
    mark = {room: "both" if len(found) > 1 else found.pop() for room, found in kinds.items()}
    order = ("runtime", "both", "tool")
    rooms = sorted(mark, key=lambda room: (order.index(mark[room]), room))
    width = max(len(r) for r in rooms)
    lines = []
    for room in rooms:
        targets = ", ".join(sorted(arrows.get(room, ()))) or "-"
        lines.append(f"{mark[room].ljust(7)} {room.ljust(width)} -> {targets}")
    return "```\n" + "\n".join(lines) + "\n```\n"


def markdown(shape: Shape) -> str:
    return figures_table(shape) + "\n" + arrows_text(shape)
