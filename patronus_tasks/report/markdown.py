"""Untrusted text as text in the Markdown this package writes for the Prefect UI.

Outputs, explanations, errors, names, sample ids and dataset columns go into artifacts,
and both of Prefect's UIs render an artifact's Markdown and its description: v1 with
marked (raw HTML through DOMPurify, which keeps ``<img>`` and ``<a>``), v2 with
react-markdown, GFM, raw HTML and a GitHub-like sanitizer. Both load an image from any
URL, and v1 keeps ``[x](javascript:...)`` live. So every untrusted value goes into
Markdown through `text` (or `cell`, `code`, `label`): backslash escapes, which both UIs
drop (``COUNT(*)`` reads ``COUNT(*)``, not italic), and a word joiner (U+2060, shown by
neither) in what GFM links by itself (``http://``, ``www.``, ``a@b.c``: v2 finds those
after escapes are undone). Entities are no way: v1 shows ``&#42;`` as it is.

Two places read Markdown differently in the two UIs, and get invisible marks instead of
backslashes, which would show: a table artifact's cells (`inert`: Markdown in v1, text in
v2) and a link's text (`label`: as written in v1, Markdown in v2). Prefect's state
messages, logs and task inputs are text in both UIs: nothing here touches them.
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
#: Characters that begin or end an inline construct anywhere in a line: escapes, code
#: spans, emphasis, strikethrough, links and images, HTML and autolinks, entities, table
#: cells (``!`` before this package's own ``[`` would make its link an image).
_INLINE = re.compile(r"[\\`*~\[\]<&|!]|" + _EDGE_UNDERSCORES)
#: What GFM links by itself: a scheme's ``://``, ``www.``, an e-mail's ``@`` (an ``@``
#: before no domain, ``pass@3``, is left alone).
_AUTOLINK = re.compile(r"(?<=[A-Za-z])(?=://)|(?i:(?<=www)(?=\.))|(?<=@)(?=[-\w]+\.)")
#: An ordered list's marker at the start of a line (``1.``, ``2)``).
_LIST = re.compile(r"^(\d{1,9})([.)])(?=\s|$)")


def fold(value: Any) -> str:
    """``value`` as one line: its runs of whitespace (newlines too) as one space."""
    return " ".join(("" if value is None else str(value)).split())


def _escaped(line: str, autolinks: bool = True) -> str:
    out = _INLINE.sub(lambda m: "".join("\\" + c for c in m.group()), line)
    return _AUTOLINK.sub(WJ, out) if autolinks else out


def text(value: Any) -> str:
    """Markdown that shows ``value`` as its characters, on one line: no link, image, HTML
    or formatting of its own, wherever it stands (a line's start too: ``# x``, ``- x``,
    ``1. x``, ``> x`` are no heading, list or quote)."""
    out = _escaped(fold(value))
    if out and out[0] in string.punctuation and not out.startswith("\\"):
        return "\\" + out
    return _LIST.sub(r"\1\\\2", out)


def cell(value: Any, width: int | None = None) -> str:
    """A Markdown table's cell that shows ``value`` (`Markdown` as it is), cut with an
    ellipsis past ``width`` characters shown."""
    if isinstance(value, Markdown):  # (a link's text may hold a |)
        return str(value).replace("|", "\\|")
    return _escaped(cut(fold(value), width))


def cut(line: str, width: int | None) -> str:
    """``line``, cut with an ellipsis past ``width`` characters (None: whole)."""
    return line if width is None or len(line) <= width else line[: width - 1] + "…"


def label(value: Any) -> str:
    """A link's text that shows ``value``. v1 shows a link's text as it is written, but
    for ``\\[`` and ``\\]``; v2 renders it as Markdown (an ``<img>`` in it loads): so its
    brackets and backticks are escaped (a backtick left would start a code span that
    takes the link apart; v1 shows that backslash) and its other constructs broken by
    invisible marks (`inert`'s). Neither UI links a URL inside a link."""
    return _marked(fold(value), in_label=True)


def link(value: Any, target: str) -> Markdown:
    """A link to ``target`` (made by this package) that reads ``value``."""
    return Markdown(f"[{label(value)}]({target})")


def code(value: Any) -> str:
    """``value`` as a code span (not in a table: a ``|`` would end the cell): a fence
    longer than any run of backticks in it, spaced when it starts or ends with one."""
    line = fold(value)
    fence = "`" * (max((len(r) for r in re.findall(r"`+", line)), default=0) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"


class Markdown(str):
    """Markdown made by this package (its untrusted parts escaped): a table takes it as
    it is."""


#: What starts a heading, quote, list, rule, fence, HTML block, table or definition at
#: a cell's start (a word joiner before it: no longer at the start).
_BLOCK_START = "#>+-=*_~`<|["
#: What an invisible mark breaks: tags, autolinks, entities, escapes, links and
#: references (a word joiner after), emphasis and strikethrough (a zero-width no-break
#: space after: no run of ``*``, ``_`` or ``~`` before a space opens one).
_MARKS = re.compile(r"[<&\\\[\]`]|\*+|~+|" + _EDGE_UNDERSCORES)


def _marked(line: str, in_label: bool = False) -> str:
    def mark(m: re.Match[str]) -> str:
        found = m.group()
        if found in "[]`":
            return "\\" + found if in_label else found + WJ * (found != "`")
        return found + (ZWNBSP if found[0] in "*~_" else WJ)

    return _MARKS.sub(mark, line)


def inert(value: Any) -> Any:
    """A table artifact's cell that shows ``value``: strings get invisible marks that
    break each Markdown construct in v1 (which renders the cell as Markdown; v2 shows it
    as text); numbers and None are as they are. A code span stays one (harmless: no
    link or HTML in it). `plain` takes the marks away."""
    if not isinstance(value, str):
        return value
    out = _AUTOLINK.sub(WJ, _marked(fold(value)))
    return WJ + out if out and (out[0] in _BLOCK_START or _LIST.match(out)) else out


def plain(value: Any) -> Any:
    """A table artifact's cell as it was given to `inert`."""
    return value.replace(WJ, "").replace(ZWNBSP, "") if isinstance(value, str) else value
