"""The package's layers import one way: no module, and no subpackage, reaches back into one
that imports it (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ferrum_cli"


def _module(path: Path) -> str:
    parts = ["ferrum_cli", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module's imports of ferrum_cli modules, at the top or inside functions alike."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("ferrum_cli")):
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if not state.get(nxt) and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    return next((c for n in sorted(graph) if not state.get(n) and (c := visit(n, [])) is not None), None)


def _layer(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_module_imports_one_that_imports_it():
    assert _cycle(_imports()) is None


def test_no_layer_imports_one_that_imports_it():
    layers: dict[str, set[str]] = {}
    for module, imported in _imports().items():
        if module == "ferrum_cli":  # the package's front door names the public API of every layer
            continue
        layers.setdefault(_layer(module), set()).update(_layer(m) for m in imported if _layer(m) != _layer(module))
    assert _cycle(layers) is None


def test_the_lower_layers_know_nothing_of_the_upper_ones():
    upper = {"ferrum_cli.cli", "ferrum_cli.batch", "ferrum_cli.executor", "ferrum_cli.status", "ferrum_cli.server"}
    lower = {"ferrum_cli.audio", "ferrum_cli.engine", "ferrum_cli.post", "ferrum_cli.weights", "ferrum_cli.platform"}
    for module, imported in _imports().items():
        if _layer(module) in lower:
            assert not {_layer(m) for m in imported} & upper, module


def test_the_server_is_a_front_end_like_the_cli():
    """Neither front end reaches into the other: both call the library below them."""
    for module, imported in _imports().items():
        layers = {_layer(m) for m in imported}
        if _layer(module) == "ferrum_cli.server":
            assert not layers & {"ferrum_cli.cli", "ferrum_cli.batch"}, module
        if _layer(module) in {"ferrum_cli.batch", "ferrum_cli.executor"}:
            assert "ferrum_cli.server" not in layers, module


PUBLIC = {
    "ferrum_cli", "ferrum_cli.errors", "ferrum_cli.options", "ferrum_cli.results", "ferrum_cli.writers",
    "ferrum_cli.languages", "ferrum_cli.executor", "ferrum_cli.status",
}  # fmt: skip


def test_the_front_ends_use_only_the_public_api():
    """The CLI, the server and the cluster's worker go through ferrum_cli's API, not around it into
    the engine, the weights or the audio layer; the CLI also drives the server and the batch layer."""
    own = {"ferrum_cli.cli": {"ferrum_cli.cli", "ferrum_cli.server", "ferrum_cli.batch"}, "ferrum_cli.server": set()}
    for module, imported in _imports().items():
        layer = _layer(module)
        if layer in own:
            outside = {m for m in imported if _layer(m) != layer and _layer(m) not in own[layer] and m not in PUBLIC}
            assert not outside, (module, outside)
    worker = next(n for n in ast.walk(ast.parse((ROOT / "batch" / "cluster.py").read_text())) if
                  isinstance(n, ast.ClassDef) and n.name == "TranscriptionWorker")  # fmt: skip
    for node in ast.walk(worker):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert f"ferrum_cli{'.' + node.module if node.module else ''}" in PUBLIC, ast.dump(node)


def test_a_model_is_loaded_in_one_place_with_its_threads():
    """from_path(model, device, dtype, threads) sets torch's threads, then loads: no front end repeats it."""
    for path in [*(ROOT / "cli").glob("*.py"), *(ROOT / "server").glob("*.py"), *(ROOT / "batch").glob("*.py")]:
        assert "set_num_threads" not in path.read_text(), path
