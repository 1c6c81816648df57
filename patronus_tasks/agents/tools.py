"""Python functions as an agent's tools: their JSON schema from type hints and docstrings,
their calls checked against it.

A tool's description is its docstring's first paragraph; each parameter's, the line naming
it under ``Args:`` (Google style) or ``:param name:`` (reST). Arguments are validated by
pydantic against the hints before the function runs, so a model's malformed arguments are
an error told back to the model, not a crash inside the tool.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from patronus_tasks.exceptions import ConfigError


class ToolError(Exception):
    """A tool call that could not be made or failed: what the model is told."""


def _param_docs(doc: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for m in re.finditer(r"^\s*:param\s+(\w+):\s*(.+)$", doc, re.M):
        found[m.group(1)] = m.group(2).strip()
    section = re.search(r"^\s*(?:Args|Arguments|Parameters):\s*\n((?:\s+.+\n?)+)", doc, re.M)
    if section:
        for m in re.finditer(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", section.group(1), re.M):
            found.setdefault(m.group(1), m.group(2).strip())
    return found


def _description(doc: str) -> str:
    head = re.split(r"\n\s*\n|^\s*(?:Args|Arguments|Parameters|Returns|Raises):", doc, maxsplit=1,
                    flags=re.M)[0]
    return " ".join(head.split())


@dataclass(frozen=True)
class Tool:
    """A function an agent may call: its name, description and argument model."""

    name: str
    description: str
    fn: Callable[..., Any]
    arguments: type[BaseModel]

    @classmethod
    def of(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        """The tool of ``fn``: every parameter must have a type hint."""
        if isinstance(fn, Tool):
            return fn
        doc = inspect.getdoc(fn) or ""
        hints, docs = get_type_hints(fn), _param_docs(doc)
        fields: dict[str, Any] = {}
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name not in hints:
                raise ConfigError(f"tool {fn.__name__!r}: parameter {p.name!r} has no type hint; "
                                  "the model is shown each argument's JSON schema, made from hints")
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hints[p.name], Field(default, description=docs.get(p.name)))
        model = create_model(f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"),
                             **fields)
        return cls(name or fn.__name__, _description(doc), fn, model)

    def schema(self) -> dict[str, Any]:
        """The tool as the OpenAI chat API takes it (``tools=[...]``)."""
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        for prop in parameters.get("properties", {}).values():
            prop.pop("title", None)
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": parameters}}

    def check(self, raw: str | dict[str, Any] | None) -> dict[str, Any]:
        """The model's arguments (JSON text) checked against the tool's schema."""
        try:
            given = json.loads(raw or "{}") if isinstance(raw, str) else (raw or {})
        except json.JSONDecodeError as exc:
            raise ToolError(f"arguments of {self.name!r} are not valid JSON ({exc.msg}): "
                            f"{str(raw)[:200]!r}") from None
        if not isinstance(given, dict):
            raise ToolError(f"arguments of {self.name!r} must be a JSON object, not {given!r}")
        try:
            model = self.arguments.model_validate(given)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                                 for e in exc.errors())
            raise ToolError(f"arguments of {self.name!r} do not fit its schema: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def call(self, arguments: dict[str, Any]) -> Any:
        """Run the tool (a sync one in a thread, so it never blocks the other rows)."""
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**arguments)
        return await asyncio.to_thread(self.fn, **arguments)


def tools_of(tools: Any) -> dict[str, Tool]:
    """Functions (or `Tool`s) by name; two with one name are a `ConfigError`."""
    found: dict[str, Tool] = {}
    for item in tools or ():
        tool = Tool.of(item)
        if tool.name in found:
            raise ConfigError(f"two tools are named {tool.name!r}: give one another name "
                              "(Tool.of(fn, name=...))")
        found[tool.name] = tool
    return found
