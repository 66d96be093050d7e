"""What a Rich renderable prints, as plain words: for tests that read the CLI's tables."""

from __future__ import annotations

from rich.console import Console


def rendered(renderable) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(renderable)
    return console.export_text().replace("│", " ")  # cells as words, without the box
