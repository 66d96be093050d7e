"""Text from jobs, specs and messages, made safe to print in a terminal through Rich.

A job's name, owner, reasons, labels, env names, zones and a message's fields come from
whoever submitted or published them. Printed as they are, `[bold red]x[/]` would be read as
Rich markup (or `[link=...]` as a hyperlink), and an ESC or another control character would
reach the terminal itself: `\\x1b[2J` clears the screen, an OSC sequence retitles the window
or hides what follows, a carriage return overwrites the line before it. `shown()` is the one
way the CLI puts such text on screen: control characters (C0, DEL, C1) and the Unicode
controls that reorder or break text become visible escapes (`\\x1b`, `\\u202e`), then Rich
markup is escaped, so the text shows literally. Our own markup stays outside it.
"""

from __future__ import annotations

from rich.markup import escape

# Bidirectional overrides and isolates reorder what follows them (U+202A..U+202E,
# U+2066..U+2069); line and paragraph separators (U+2028, U+2029) break a line as a newline does.
_UNICODE_CONTROLS = frozenset([*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), "\u2028", "\u2029"])


def _visible(char: str) -> str:
    code = ord(char)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if char in _UNICODE_CONTROLS:
        return f"\\u{code:04x}"
    return char


def uncontrolled(value: object) -> str:
    """`value` as text with every control character replaced by a visible escape (no markup
    escaping: for plain output, or a `rich.text.Text`)."""
    text = "" if value is None else str(value)
    if text.isprintable() and text.isascii():  # the common case: nothing to replace
        return text
    return "".join(_visible(char) for char in text)


def shown(value: object) -> str:
    """`value` as Rich markup that prints it literally: no control character reaches the
    terminal, and no `[...]` in it is read as a style or a link."""
    return escape(uncontrolled(value))
