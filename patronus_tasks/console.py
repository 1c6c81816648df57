"""Untrusted text on a terminal: model output, explanations, errors and names are printed
by the summary and the CLI, and a terminal obeys what it is sent. An escape sequence in a
model's answer could clear the screen, rewrite the lines above (a failed row shown as
passed), set the window title, write the clipboard (OSC 52) or make a hidden hyperlink
(OSC 8); bidirectional controls reorder what is read. So every control character but the
newline and the tab is shown as its escape (``\\x1b``), never sent as itself.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with each control character (but newline and tab) as its escape."""
    return _UNSAFE.sub(_escaped, text)

