"""The folders of shared/tpujobs are its layers, and every module sits in one of them."""

from __future__ import annotations

from pathlib import Path

import grimp
import tomllib

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "shared" / "tpujobs"


def _contract(kind: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["type"] == kind)


def _layers() -> list[str]:
    return [name.strip() for name in _contract("layers")["layers"]]


def test_every_module_belongs_to_a_layer() -> None:
    """A module outside every layer's folder is one import-linter never checks: none may exist."""
    layers = _layers()
    homeless = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "__init__.py"
        and not any(path.is_relative_to(PACKAGE.joinpath(*layer.split(".")[1:])) for layer in layers)
    )
    assert homeless == []


def test_each_layer_is_one_folder_of_the_package() -> None:
    """The contract names folders, not single modules: one line per layer, each a real folder."""
    for layer in _layers():
        assert ":" not in layer, layer
        assert (PACKAGE.joinpath(*layer.split(".")[1:]) / "__init__.py").is_file(), layer


def test_the_layers_scan_is_not_vacuous() -> None:
    """The package has modules in every layer the contract names."""
    graph = grimp.build_graph("tpujobs")
    for layer in _layers():
        assert graph.find_descendants(layer), layer


def test_no_module_imports_another_in_a_loop() -> None:
    """No pair of modules reaches each other through imports: every dependency points one way."""
    graph = grimp.build_graph("tpujobs")
    loops = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if module < imported and graph.chain_exists(imported, module)
    )
    assert loops == []


def test_no_class_is_over_300_lines() -> None:
    """A class past 300 lines does more than one thing: split it along its seams."""
    import ast

    too_long = sorted(
        (node.end_lineno - node.lineno + 1, f"{path.relative_to(PACKAGE)}:{node.name}")
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > 300
    )
    assert too_long == []
