"""A page of rows as the form a person answers in Prefect's UI, and its answers read back.

What was tried in Chromium on Prefect 3.9.1 decides the shape: the Resume form is a
~510 px modal; the form's description above the fields is squeezed (to a 400 px box
with 3 fields, to nothing with more), so each row's facts live in its own field: the
label's title is the row's sample id and the judge's answer, its description the facts
(input, output, gold answer, retrieved context, the judge's explanation), cut to stay
readable. A ``Literal`` is a drop-down: the scale and "skip". An ``Optional[str]`` shows a
"str / None" toggle first, so the note is a plain ``str`` with an empty default. Prefect's
``with_initial_data`` drops the fields' titles and descriptions: the model is made here
with them. The reviewer's name is asked once per page, first.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Literal

import pydantic

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.labels import Label
from patronus_tasks.review.rows import Reviewable
from patronus_tasks.review.shown import CUTS, in_field, in_markdown

#: Rows a page asks by default: each is two fields (its label and a note). Five rows of
#: the bundled RAG set (11 fields) made a form ~1,900 px tall (v2; measured in Chromium),
#: scrolled in the modal a row or two at a time; v1 had squeezed the page's description
#: away already (a 1,000 px window), which is why each row's facts are in its fields.
PAGE_SIZE = 5
#: The most a page may ask (41 fields).
MAX_PAGE_SIZE = 20
REVIEWER = "reviewer"
_NAME_CHARS = 100
_NOTE_CHARS = 2000


def skip_value(scale: list[str]) -> str:
    """The choice that gives no label: "skip" (or, when the scale has a "skip", "(no label)")."""
    return "skip" if "skip" not in scale else "(no label)"


def facts(row: Reviewable) -> list[tuple[str, Any]]:
    """What a person reads of a row, in order: the judge's answer, then what it saw."""
    said = str(row.verdict)
    if row.p_pass is not None:
        said += f" (probability of a pass {row.p_pass:.2f})"
    elif row.score is not None and row.verdict not in ("pass", "fail"):
        said += f" (score {row.score:.3g})"
    if row.judges:
        said += "; the panel: " + ", ".join(f"{m}: {a}" for m, a in row.judges)
    found: list[tuple[str, Any]] = [("judge", said)]
    if row.explanation:
        found.append(("explanation", row.explanation))
    for name, value in (("input", row.input), ("output", row.output),
                        ("gold answer", row.gold_answer), ("context", row.context)):
        if value is not None and (not isinstance(value, str) or value.strip()):
            found.append((name, value))
    return found


def field_names(sid: str) -> tuple[str, str]:
    """A row's two fields (label, note): named by its sample id's hash, so an answer is
    read by row whatever else its page showed."""
    digest = hashlib.sha256(sid.encode()).hexdigest()[:12]
    return f"label_{digest}", f"note_{digest}"


@dataclass(frozen=True)
class Page:
    """One page of rows: the rows it shows, its form's fields and description, and the
    key of its pause (``key``: the same for the same page of the same review, whichever
    of its rows are still to label)."""

    evaluator: str
    rows: list[Reviewable]
    scale: list[str]
    number: int  # 1-based
    pages: int
    key: str
    preset: bool = False

    @property
    def skip(self) -> str:
        return skip_value(self.scale)

    def showing(self, rows: list[Reviewable]) -> Page:
        """The page asking only ``rows`` (those still to label), under its key."""
        return replace(self, rows=rows)

    def description(self, experiment: str, first: int, total: int) -> str:
        """The form's description (Markdown; squeezed away on a long page: a summary)."""
        rows = f"rows {first} to {first + len(self.rows) - 1} of {total}"
        return (f"**Review of {in_markdown(self.evaluator)}** on {in_markdown(experiment)}: page "
                f"{self.number} of {self.pages}, {rows}.\n\nUnder each row's field: what the judge "
                f"saw and said. Choose your label ({in_markdown(', '.join(self.scale))}), or "
                f"{in_markdown(self.skip)} for none; a note if you like. Your name is asked once, "
                "first.")

    def fields(self) -> dict[str, tuple[Any, Any]]:
        """The form's fields: the reviewer's name, then each row's label and note."""
        choices: Any = Literal[tuple([*self.scale, self.skip])]
        found: dict[str, tuple[Any, Any]] = {REVIEWER: (str, pydantic.Field(
            title="Your name", min_length=1, max_length=_NAME_CHARS,
            description="Asked once for the page: your labels are kept under it, apart from "
                        "other people's."))}
        for row in self.rows:
            label, note = field_names(row.sid)
            preset = self.preset and row.verdict in self.scale
            title = f"{in_field(row.sid, 80)}: the judge said {in_field(row.verdict, 40)}" + (
                "; pre-set to it here: change it if you disagree" if preset else "")
            found[label] = (choices, pydantic.Field(
                default=row.verdict if preset else self.skip, title=title,
                description="\n\n".join(f"▸ {name}: {in_field(value, CUTS.get(name, 400))}"
                                        for name, value in facts(row)
                                        if (name, value) != ("judge", row.verdict))))  # in the title
            found[note] = (str, pydantic.Field(
                default="", max_length=_NOTE_CHARS, title=f"{in_field(row.sid, 80)}: your note",
                description="Optional: why, in a few words."))
        return found

    def read(self, answer: dict[str, Any]) -> list[Label]:
        """The labels in an answer (validated by the form's model): one per row of the
        page it holds and does not skip, under the reviewer's name."""
        reviewer = " ".join(str(answer.get(REVIEWER) or "").split())
        if not reviewer:
            raise ConfigError("review: the answer has no reviewer's name.")
        found = []
        for row in self.rows:
            label_field, note_field = field_names(row.sid)
            label = answer.get(label_field)
            if label is None or label == self.skip:
                continue
            if label not in self.scale:  # the form refuses it; an answer sent otherwise too
                raise ConfigError(f"review: row sid={row.sid}: {label!r} is not on the scale "
                                  f"({', '.join(self.scale)}).")
            note = " ".join(str(answer.get(note_field) or "").split()) or None
            found.append(Label(row.sid, self.evaluator, str(label), reviewer, note))
        return found


def page_key(call: int, evaluator: str, rows: list[Reviewable]) -> str:
    """A pause's key: the review's number in its flow run (a second review of the same
    rows asks again), the evaluator and the page's rows. A suspended run, running again,
    gets the same keys: Prefect then gives the answer instead of asking again."""
    ids = "\n".join([evaluator, *(r.sid for r in rows)]).encode()
    return f"review-{call}-{hashlib.sha256(ids).hexdigest()[:16]}"


def check_page_size(size: int | None) -> int:
    size = PAGE_SIZE if size is None else size
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PAGE_SIZE:
        raise ConfigError(f"review: page_size must be 1 to {MAX_PAGE_SIZE} rows (each is two fields "
                          f"of a ~510 px form), not {size!r}.")
    return size


def paginate(evaluator: str, rows: list[Reviewable], scale: list[str], size: int | None,
             call: int = 0, preset: bool = False) -> list[Page]:
    """``rows`` in pages of ``size`` (None: `PAGE_SIZE`)."""
    size = check_page_size(size)
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    return [Page(evaluator, chunk, scale, i + 1, len(chunks), page_key(call, evaluator, chunk), preset)
            for i, chunk in enumerate(chunks)]


def model(page: Page, base: type[pydantic.BaseModel] = pydantic.BaseModel) -> type[pydantic.BaseModel]:
    """The page's form as a pydantic model (on ``base``: Prefect's ``RunInput``)."""
    made: type[pydantic.BaseModel] = pydantic.create_model(  # type: ignore[call-overload]
        "Review", __base__=base, **page.fields())
    return made
