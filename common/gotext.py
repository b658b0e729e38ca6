"""Go's ways of writing values into messages, where a message the user sees must read as the reference's."""

from __future__ import annotations

_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", '"': '\\"', "\\": "\\\\"}


def go_quote(text: str) -> str:
    """Go's fmt %q of a string (strconv.Quote): printable runes kept, the rest escaped Go's way."""
    out = []
    for char in text:
        code = ord(char)
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif 0xD800 <= code < 0xE000:  # a lone surrogate escape: Go's JSON decoder made it U+FFFD
            out.append("\ufffd")
        elif char.isprintable():
            out.append(char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'

