"""The package's layers, enforced on its imports (read with ``ast``, every import counted,
those inside functions too): no module imports one of a layer above its own, no two
modules import each other through any chain, and nothing outside a package imports its
private (``_``) modules. docs/architecture.md explains the layers.

Bottom to top; a module may import its own layer and those below it."""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "audit.errors",
            "audit.text",
            "audit.atomic",
            "audit.interrupts",
            "audit.heap",
            "audit.walk",
            "audit.bounded_yaml",
            "audit.progress",
            "audit.windows",
            "audit.redact",
            "audit.format",
        ),
    ),
    ("config", ("audit.config", "audit.watch.settings")),
    ("warehouse", ("audit.warehouse", "audit.warehouse.*")),
    ("importers", ("audit.importers", "audit.importers.*")),
    (
        "facts",
        (
            "audit.costs",
            "audit.usage",
            "audit.recipes",
            "audit.facts",
            "audit.facts.*",
            "audit.suppressions",
            "audit.queue",
        ),
    ),
    (
        "rules",
        (
            "audit.rule_api",
            "audit.rule_registry",
            "audit.rules",
            "audit.rules.*",
            "audit.materiality",
            "audit.scans",
            "audit.testing",
        ),
    ),
    (
        "services",
        (
            "audit.summary",
            "audit.status",
            "audit.query",
            "audit.query.*",
            "audit.reports",
            "audit.reports.*",
            "audit.actions",
            "audit.actions.*",
            "audit.watch",
            "audit.watch.*",
        ),
    ),
    (
        "interface",
        ("audit", "audit.__main__", "audit.entry", "audit.cli", "audit.cli.*", "audit.docs"),
    ),
]


def modules() -> dict[str, Path]:
    """Every module of the package by its import name (``rules/`` is ``audit.rules``)."""
    found = {}
    for folder, package in (("audit", "audit"), ("rules", "audit.rules")):
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = [package, *path.relative_to(REPO / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                found |= {owner(f"{base}.{alias.name}") or owner(base) for alias in node.names}
        found.discard(None)
        found.discard(module)
        graph[module] = found
    return graph


def layer_of(module: str) -> int | None:
    exact = [i for i, (_, names) in enumerate(LAYERS) if module in names]
    if exact:
        return exact[0]
    matched = [
        i for i, (_, names) in enumerate(LAYERS) if any(fnmatchcase(module, n) for n in names)
    ]
    return matched[0] if matched else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    graph = imports(modules())
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_no_import_cycles():
    assert cycles(imports(modules())) == []


def test_private_modules_stay_inside_their_package():
    graph = imports(modules())
    private = [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if target.rpartition(".")[2].startswith("_")
        and not target.rpartition(".")[2].startswith("__")
        and not module.startswith(target.rpartition(".")[0] + ".")
    ]
    assert private == []


def test_the_checker_sees_what_it_must():
    """The checks themselves: a planted cycle and an upward import are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = imports(modules())
    assert "audit.warehouse.frames" in graph["audit.importers.files"]
    assert layer_of("audit.cli.scan") > layer_of("audit.rules.ovp001_idle_allocated_gpus")
