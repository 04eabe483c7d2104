"""The package order of docs/architecture.md, enforced: no import of a higher layer, no
file-level cycle, and no folder-level cycle (within each package folder, every
sub-folder counted as one node beside the folder's files: two sub-packages that import
each other through different files are still a cycle).

Every ``import``/``from ... import`` of a ``diffserve`` module counts, wherever it is
written (module level, inside a function, under ``TYPE_CHECKING``): a deferred import is
still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diffserve"

# Low -> high. A module may import its own layer and the layers below it, never one
# above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "logging"),
    ("types",),
    ("registry",),
    ("config",),
    ("tracing",),
    ("layers",),
    ("models",),
    ("worker",),
    ("executor",),
    ("ar",),
    ("engine",),
    ("zoo",),
    ("provenance",),
    ("entrypoints",),
    ("ray_serve",),
)
# Test and demo models (builders, tokenizer makers, the toy model's trainer) are
# fixtures, not serving code: they build directories for any serving layer to load, so
# they may use only these.
ZOO_MAY_IMPORT = ("errors", "logging", "registry", "zoo")
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
ROOT_MODULE = "diffserve"  # the package __init__: the public API, above everything


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package modules ``source`` imports, relative imports resolved. ``from pkg
    import name`` counts ``pkg.name`` when that is a module, else ``pkg``; the root
    ``diffserve`` (every module's implicit parent, lazy by design) is never a
    dependency."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                found.add(
                    f"{target}.{alias.name}"
                    if f"{target}.{alias.name}" in known
                    else target
                )
    return {name for name in found if name in known and name != ROOT_MODULE}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)
    return RANK[parts[1]]


def import_graph(files: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the package modules it imports."""
    known = set(files)
    return {
        module: imports_of(source, module, is_package, known) - {module}
        for module, (source, is_package) in files.items()
    }


def package_files() -> dict[str, tuple[str, bool]]:
    return {
        module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        for target in targets:
            if layer_of(target) > layer_of(module):
                bad.append(f"{module} imports {target} (a higher layer)")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), plus
    self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_subpackage_has_a_layer() -> None:
    top = {
        p.name if p.is_dir() else p.stem
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.stem != "__init__")
    }
    assert top <= set(RANK), (
        f"declare these in LAYERS (and docs/architecture.md): {sorted(top - set(RANK))}"
    )


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports(import_graph(package_files())) == []


def test_no_file_level_import_cycle() -> None:
    assert cycles(import_graph(package_files())) == []


def folder_graphs(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """package folder -> the import graph among its children: each sub-folder collapsed
    into one node (named by its package), each of the folder's own files a node (its
    ``__init__`` named by the folder). Imports within one child are dropped: that
    child's own folder graph (or the file-level check) sees them."""
    folders = {module.rsplit(".", 1)[0] for module in graph if "." in module}
    result: dict[str, dict[str, set[str]]] = {}
    for folder in sorted(folders):
        prefix = f"{folder}."

        def child(module: str, prefix: str = prefix) -> str:
            return (
                prefix + module[len(prefix) :].split(".")[0]
                if module.startswith(prefix)
                else module
            )

        inside = [
            module for module in graph if module == folder or module.startswith(prefix)
        ]
        siblings: dict[str, set[str]] = {child(module): set() for module in inside}
        for module in inside:
            siblings[child(module)].update(
                child(target)
                for target in graph[module]
                if target == folder or target.startswith(prefix)
            )
        result[folder] = {node: targets - {node} for node, targets in siblings.items()}
    return result


def folder_cycles(graph: dict[str, set[str]]) -> list[str]:
    """``"folder: [child, ...]"`` for every cycle among a folder's children (names
    relative to the package)."""

    def short(name: str) -> str:
        return name.removeprefix(f"{ROOT_MODULE}.")

    return [
        f"{folder}: [{', '.join(short(node) for node in component)}]"
        for folder, siblings in folder_graphs(graph).items()
        for component in cycles(siblings)
    ]


def test_no_folder_level_import_cycle() -> None:
    assert folder_cycles(import_graph(package_files())) == []


def zoo_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the zoo beyond ZOO_MAY_IMPORT, and serving code below entrypoints
    importing the zoo."""
    bad = []
    for module, targets in graph.items():
        part = module.split(".")[1] if "." in module else ""
        for target in targets:
            other = target.split(".")[1]
            if part == "zoo" and other not in ZOO_MAY_IMPORT:
                bad.append(
                    f"{module} imports {target} "
                    f"(the zoo uses only {', '.join(ZOO_MAY_IMPORT)})"
                )
            elif other == "zoo" and part not in ("zoo", "entrypoints"):
                bad.append(
                    f"{module} imports {target} (serving code never depends "
                    "on test models)"
                )
    return sorted(bad)


def test_the_zoo_stays_apart_from_serving_code() -> None:
    assert zoo_violations(import_graph(package_files())) == []
    models = [p.name for p in (PACKAGE / "models").iterdir()]
    assert not [name for name in models if name.startswith(("tiny", "toy"))], models


@pytest.mark.parametrize(
    "module, source",
    [
        (
            "diffserve.zoo.wrong_way",
            "from diffserve.models.loader import load_strict\n",
        ),
        (
            "diffserve.models.wrong_way",
            "from diffserve.zoo.flux import build_flux_model\n",
        ),
    ],
)
def test_a_zoo_violation_is_caught(module: str, source: str) -> None:
    bad = zoo_violations(import_graph(_with(package_files(), module, source)))
    assert len(bad) == 1 and bad[0].startswith(f"{module} imports "), bad


def test_layers_match_the_architecture_doc() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    declared = " < ".join("/".join(names) for names in LAYERS)
    assert declared in doc, (
        f"docs/architecture.md must state the layer order: {declared}"
    )


# -- the checks themselves fail on the mistakes they exist for
# ---------------------------------------


def _with(
    files: dict[str, tuple[str, bool]], module: str, source: str
) -> dict[str, tuple[str, bool]]:
    return {**files, module: (source, False)}


@pytest.mark.parametrize(
    "module, source",
    [
        (
            "diffserve.models.wrong_way",
            "from diffserve.engine.core import EngineCore\n",
        ),
        (
            "diffserve.worker.wrong_way",
            "def f():\n    from diffserve.executor import factory\n",
        ),
        (
            "diffserve.config.wrong_way",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from diffserve.layers.kernels import KernelSet\n",
        ),
        ("diffserve.types.wrong_way", "import diffserve.config.schema\n"),
    ],
)
def test_a_wrong_way_import_is_caught(module: str, source: str) -> None:
    files = _with(package_files(), module, source)
    bad = upward_imports(import_graph(files))
    assert len(bad) == 1 and bad[0].startswith(f"{module} imports "), bad


def test_a_file_cycle_is_caught() -> None:
    files = package_files()
    files = _with(files, "diffserve.config.ping", "from diffserve.config import pong\n")
    files = _with(
        files, "diffserve.config.pong", "from diffserve.config.ping import X\n"
    )
    assert ["diffserve.config.ping", "diffserve.config.pong"] in cycles(
        import_graph(files)
    )


def test_a_folder_cycle_is_caught() -> None:
    # config/ping/a.py -> config/pong.py -> config/ping/b.py: no two files in a cycle,
    # but the folder ping and the file pong import each other.
    files = {**package_files(), "diffserve.config.ping": ("", True)}
    files = _with(
        files, "diffserve.config.ping.a", "from diffserve.config import pong\n"
    )
    files = _with(
        files, "diffserve.config.pong", "from diffserve.config.ping.b import X\n"
    )
    files = _with(files, "diffserve.config.ping.b", "X = 1\n")
    graph = import_graph(files)
    assert not [c for c in cycles(graph) if "diffserve.config.pong" in c]
    assert "diffserve.config: [config.ping, config.pong]" in folder_cycles(graph)


def test_relative_imports_are_resolved() -> None:
    known = {"diffserve.engine", "diffserve.engine.core", "diffserve.models.flux.x"}
    assert imports_of(
        "from ...engine import core\n", "diffserve.models.flux.x", False, known
    ) == {"diffserve.engine.core"}


# -- family facts stay in models/, registry/ and the zoo
# -------------------------------------------------------

# The words that name a model family or one of its parts; every registered family must
# be named by one of them (so a new family extends this list and the check below covers
# it).
FAMILY_WORDS = (
    "flux",
    "kontext",
    "wan",
    "sd3",
    "stablediffusion",
    "pixart",
    "qwen",
    "zimage",
    "z-image",
    "umt5",
    "t5",
    "hunyuan",
    "ltx",
)
FAMILY_NAME = re.compile(
    r"(?<![a-z0-9])(" + "|".join(map(re.escape, FAMILY_WORDS)) + r")(?![a-z])",
    re.IGNORECASE,
)
SHARED_ROOMS = ("engine", "executor", "worker", "entrypoints")


def family_mentions(files: dict[str, str]) -> list[str]:
    """``path:line: text`` for every line of a shared room's file (code, comments,
    strings, assets) that names a family."""
    return [
        f"{path}:{number}: {line.strip()}"
        for path, text in sorted(files.items())
        for number, line in enumerate(text.splitlines(), 1)
        if FAMILY_NAME.search(line)
    ]


def shared_room_files() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for room in SHARED_ROOMS
        for path in sorted((PACKAGE / room).rglob("*"))
        if path.is_file() and path.suffix in (".py", ".js", ".html", ".css")
    }


def test_no_shared_room_names_a_family() -> None:
    from diffserve.registry.models import MODEL_FAMILIES

    unnamed = [
        name
        for name in MODEL_FAMILIES
        if not FAMILY_NAME.search(name.lower().replace("pipeline", " "))
        and not any(word in name.lower() for word in FAMILY_WORDS)
    ]
    assert unnamed == [], f"add a word naming these families to FAMILY_WORDS: {unnamed}"
    assert family_mentions(shared_room_files()) == []


def test_a_family_mention_is_caught() -> None:
    files = {
        "diffserve/engine/x.py": "# runs FLUX's loop\nwanted = 1  # not a family\nT5 "
        "tokens\nflux2 = 0\n"
    }
    assert [m.split(":")[1] for m in family_mentions(files)] == ["1", "3", "4"]


def test_the_job_system_imports_no_http_module() -> None:
    """The durable job system (store, runner, artifacts) is its own room: the HTTP
    routes use it, never the other way, and it needs no web framework."""
    graph = import_graph(package_files())
    jobs = [m for m in graph if m.startswith("diffserve.entrypoints.jobs")]
    assert jobs and not [
        f"{m} imports {t}"
        for m in jobs
        for t in graph[m]
        if t.startswith("diffserve.entrypoints.openai")
    ]
    sources = [(PACKAGE / "entrypoints" / "jobs").rglob("*.py")]
    web = re.compile(
        r"^\s*(from|import)\s+(starlette|fastapi|uvicorn|httpx)\b", re.MULTILINE
    )
    assert not [
        p.name
        for files in sources
        for p in files
        if web.search(p.read_text(encoding="utf-8"))
    ]
