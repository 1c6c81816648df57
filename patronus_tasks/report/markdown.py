"""Untrusted text as text in the Markdown this package writes for the Prefect UI.

(The part of the i48-md branch's module of the same name that review needs, with the
same names and behaviour: on merge, that module replaces this one whole.)

Outputs, inputs, gold answers, explanations, sample ids and names go into Markdown that
both of Prefect's UIs render: v1 with marked (its raw HTML through DOMPurify, which keeps
``<img>`` and ``<a>``), v2 with react-markdown. So every untrusted value goes through
`text`: backslash escapes, which both UIs drop, and a word joiner (U+2060, which neither
shows) breaking what GFM would link by itself (``http://``, ``www.``, ``a@b.c``).

Where v1 renders Markdown and v2 shows plain text (a table artifact's cells; a pause
form's field descriptions) a backslash would show in v2: `inert` puts invisible marks
instead, that break each construct in marked and that v2 does not show.
"""

from __future__ import annotations

import re
import string
from typing import Any

#: Word joiner: zero width, no break; what breaks a construct without a visible trace.
WJ = "\u2060"
#: Zero-width no-break space: JavaScript's ``\s`` counts it as a space, so a ``*`` or ``_``
#: before it opens no emphasis in marked (nor in micromark).
ZWNBSP = "\ufeff"

#: A run of underscores that can begin or end emphasis: not inside a word (``a_b`` is text).
_EDGE_UNDERSCORES = r"(?<!_)(?:(?<![^\W_])_+|_++(?![^\W_]))"
#: Characters that begin or end an inline construct anywhere in a line.
_INLINE = re.compile(r"[\\`*~\[\]<&|!]|" + _EDGE_UNDERSCORES)
#: What GFM links by itself: a scheme's ``://``, ``www.``, an e-mail's ``@``.
_AUTOLINK = re.compile(r"(?<=[A-Za-z])(?=://)|(?i:(?<=www)(?=\.))|(?<=@)")
#: An ordered list's marker at the start of a line (``1.``, ``2)``).
_LIST = re.compile(r"^(\d{1,9})([.)])(?=\s|$)")
#: What starts a heading, quote, list, rule, fence, HTML block, table or definition.
_BLOCK_START = "#>+-=*_~`<|["
_INERT = re.compile(r"[<\]&\\]|\*+|~+|" + _EDGE_UNDERSCORES)


def fold(value: Any) -> str:
    """``value`` as one line: its runs of whitespace (newlines too) as one space."""
    return " ".join(("" if value is None else str(value)).split())


def cut(line: str, width: int | None) -> str:
    """``line``, cut with an ellipsis past ``width`` characters (None: whole)."""
    return line if width is None or len(line) <= width else line[: width - 1] + "…"


def _escaped(line: str) -> str:
    return _AUTOLINK.sub(WJ, _INLINE.sub(lambda m: "".join("\\" + c for c in m.group()), line))


def text(value: Any) -> str:
    """Markdown that shows ``value`` as its characters, on one line: no link, image, HTML
    or formatting of its own, wherever it stands (a line's start too)."""
    out = _escaped(fold(value))
    if out and out[0] in string.punctuation and not out.startswith("\\"):
        return "\\" + out
    return _LIST.sub(r"\1\\\2", out)


def inert(value: Any) -> Any:
    """A string that shows as itself both where it is rendered as Markdown by v1 and
    shown as text by v2 (see the module); numbers and None are as they are."""
    if not isinstance(value, str):
        return value
    out = _INERT.sub(lambda m: m.group() + (ZWNBSP if m.group()[0] in "*~_" else WJ), fold(value))
    out = _AUTOLINK.sub(WJ, out)
    return WJ + out if out and (out[0] in _BLOCK_START or _LIST.match(out)) else out
