"""Count what keeps the package's layout honest, and fail when a count rises above its budget.

Read from the code's own imports (every `import` statement, including those under
`if TYPE_CHECKING:` and inside functions: a circle through a type-only import is still a knot in
the design):
- circles: groups of modules that import each other, directly or through others;
- upward imports: an import from a module of a lower layer to one of a higher layer (the table
  below names each room's layer: a top-level module, or a package of llmchat);
- modules over the line limit, and modules near it (over 450 lines: a module is one job, and one
  packed to fit the limit is two);
- modules loose at the package's root, outside every room (entry points, the environment, errors,
  paths, defaults: at most a dozen).

Run: `python .ci/imports.py` (CI runs it). `--list` prints every offending import. A new room must
be given a layer in LAYERS; a count may only go down: lower its budget when you lower it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "llmchat"
MAX_LINES = 500
NEAR_LINES = 450

# Bottom to top. A room may import rooms of its own layer or lower ones (without a circle).
LAYERS: dict[str, int] = {
    # the base: small modules every layer may use
    "__init__": 0,
    "__main__": 9,
    "errors": 0,
    "edges": 0,
    "interrupts": 0,
    "paths": 0,
    "private_files": 0,
    "defaults": 0,
    "output": 0,
    "options": 0,
    "gguf": 1,
    "engine": 2,
    "prompt": 3,
    "reasoning": 3,
    "tools": 4,
    "store": 4,
    "config": 4,
    "models": 5,
    "env": 5,
    "media": 5,
    "turn": 7,
    "startup": 8,
    "batch": 8,
    "ui": 8,
    "commands": 9,
    "launch": 9,
    "exits": 9,
    "cli": 9,
}

# CI fails when a count rises above its budget. The layout reached 0 of each (from 2 circles,
# 8 upward imports by this table, and 8 modules over 500 lines); keep it there.
# The rooms of the 2026-12 layout took the loose root modules from 30 to 12, and the modules near
# the limit from 12 to 7 (the history store, the MCP connection, the model stores and the batch
# command split by role).
BUDGET = {
    "circles": 0,
    "upward imports": 0,
    "modules over 500 lines": 0,
    "modules over 450 lines": 7,
    "loose root modules": 12,
}


_ENTRY_FILES = {"__init__.py", "__main__.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path, module: str, known: set[str]) -> set[str]:
    """The package's modules that `module` imports (a `from pkg import name` that names a
    submodule counts as an import of that submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names] + [source]
        else:
            continue
        for target in targets:
            # The longest known module the name starts with: a name inside a module is that module.
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and parts[0] == PACKAGE and ".".join(parts) != module:
                found.add(".".join(parts))
    # `from llmchat.pkg import sub` counts pkg too: importing a submodule runs its package's
    # __init__ first.
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def measure() -> tuple[dict[str, int], list[str], list[str]]:
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(path): path for path in files}
    known = set(modules)
    graph: dict[str, set[str]] = {
        name: imported_modules(path, name, known) - {name.rsplit(".", 1)[0]} for name, path in modules.items()
    }
    problems: list[str] = []
    unplaced = sorted({room_of(name) for name in modules} - set(LAYERS))
    for room in unplaced:
        problems.append(f"{PACKAGE}/{room} has no layer: give it one in LAYERS ({Path(__file__).name})")
    for room in sorted(set(LAYERS) - {room_of(name) for name in modules}):
        problems.append(f"LAYERS names {PACKAGE}/{room}, which is gone: remove it ({Path(__file__).name})")
    circles = strongly_connected(graph)
    upward: list[str] = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            source_room, target_room = room_of(name), room_of(target)
            if source_room == target_room or source_room not in LAYERS or target_room not in LAYERS:
                continue
            if LAYERS[source_room] < LAYERS[target_room]:
                upward.append(f"{name} -> {target}")
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules.items()}
    over = sorted((name for name, size in sizes.items() if size > MAX_LINES), key=lambda n: -sizes[n])
    near = sorted((name for name, size in sizes.items() if size > NEAR_LINES), key=lambda n: -sizes[n])
    loose = sorted(
        name for name, path in modules.items() if path.parent == ROOT / PACKAGE and path.name not in _ENTRY_FILES
    )
    counts = {
        "circles": len(circles),
        "upward imports": len(upward),
        "modules over 500 lines": len(over),
        "modules over 450 lines": len(near),
        "loose root modules": len(loose),
    }
    largest = max(sizes, key=lambda n: sizes[n])
    details = [f"circle: {' '.join(group)}" for group in circles]
    details += [f"upward: {line}" for line in upward]
    details += [f"over {MAX_LINES} lines: {name} ({sizes[name]})" for name in over]
    details += [f"over {NEAR_LINES} lines: {name} ({sizes[name]})" for name in near]
    details += [f"loose at the root: {name}" for name in loose]
    details.append(f"largest module: {largest} ({sizes[largest]} lines)")
    return counts, details, problems


def main(argv: list[str]) -> int:
    counts, details, problems = measure()
    print("imports: " + ", ".join(f"{key} {value} (budget {BUDGET[key]})" for key, value in counts.items()))
    if "--list" in argv:
        print("\n".join(details))
    else:
        print(details[-1])
    failed = False
    for key, value in counts.items():
        if value > BUDGET[key]:
            print(f"imports: {key} rose to {value}, above its budget of {BUDGET[key]}", file=sys.stderr)
            failed = True
    for problem in problems:
        print(f"imports: {problem}", file=sys.stderr)
        failed = True
    if failed:
        print("imports: run `python .ci/imports.py --list` to see each one", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
