"""What model calls cost: a small dated table of public prices, and the user's own.

A call's cost is its tokens at its model's price: input tokens at the input price,
output tokens at the output price, both in US dollars per million tokens. A model is
found by its exact name only (a dated snapshot is priced only when listed: some cost
other than their alias did, ``gpt-4o-2024-05-13`` among them), and a model with no price
costs nothing known: its tokens are counted, its cost left empty, never guessed.

`PRICES_AS_OF` and `PRICE_SOURCES` say where the table comes from and when: the
providers' standard (not batch, not cached-input) prices. Prices change; pass
``prices={"model": (input, output)}`` to an experiment to set or override any of them
(``None`` removes one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from patronus_tasks.define.step_results import Usage
from patronus_tasks.exceptions import ConfigError


@dataclass(frozen=True)
class Price:
    """A model's price in US dollars per million input and output tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


PRICES_AS_OF = "2025-08-15"
PRICE_SOURCES = ("https://platform.openai.com/docs/pricing",
                 "https://docs.anthropic.com/en/docs/about-claude/pricing")

_OPENAI = {
    "gpt-4o": (2.50, 10.00), "gpt-4o-2024-08-06": (2.50, 10.00),
    "gpt-4o-2024-11-20": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60), "gpt-4o-mini-2024-07-18": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00), "gpt-4.1-2025-04-14": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60), "gpt-4.1-mini-2025-04-14": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40), "gpt-4.1-nano-2025-04-14": (0.10, 0.40),
    "o3": (2.00, 8.00), "o3-mini": (1.10, 4.40), "o4-mini": (1.10, 4.40),
    "gpt-3.5-turbo": (0.50, 1.50),
}
_ANTHROPIC = {
    "claude-opus-4-1": (15.00, 75.00), "claude-opus-4-1-20250805": (15.00, 75.00),
    "claude-opus-4-0": (15.00, 75.00), "claude-opus-4-20250514": (15.00, 75.00),
    "claude-sonnet-4-0": (3.00, 15.00), "claude-sonnet-4-20250514": (3.00, 15.00),
    "claude-3-7-sonnet-latest": (3.00, 15.00), "claude-3-7-sonnet-20250219": (3.00, 15.00),
    "claude-3-5-haiku-latest": (0.80, 4.00), "claude-3-5-haiku-20241022": (0.80, 4.00),
    "claude-3-haiku-20240307": (0.25, 1.25),
}
#: Public prices as of `PRICES_AS_OF`, from `PRICE_SOURCES`.
DEFAULT_PRICES: dict[str, Price] = {name: Price(*p) for name, p in {**_OPENAI, **_ANTHROPIC}.items()}

PriceInput = Price | tuple[float, float] | Mapping[str, float] | None


def _price(model: str, value: PriceInput) -> Price | None:
    if value is None or isinstance(value, Price):
        return value
    try:
        if isinstance(value, Mapping):
            price = Price(float(value["input_per_mtok"]), float(value["output_per_mtok"]))
        else:
            price = Price(*(float(v) for v in value))
    except (KeyError, TypeError, ValueError):
        price = Price(-1.0, -1.0)
    if price.input_per_mtok < 0 or price.output_per_mtok < 0:
        raise ConfigError(f"prices[{model!r}] = {value!r}: give (input, output) in USD per "
                          "million tokens, both >= 0, e.g. prices={'my-model': (0.5, 1.5)}.")
    return price


class PriceTable:
    """`DEFAULT_PRICES` with the user's prices over them; what a call cost."""

    def __init__(self, prices: Mapping[str, PriceInput] | None = None) -> None:
        table: dict[str, Price | None] = dict(DEFAULT_PRICES)
        for model, value in (prices or {}).items():
            table[str(model)] = _price(str(model), value)
        self.table = {k: v for k, v in table.items() if v is not None}

    def cost(self, usage: Usage | None) -> float | None:
        """The call's cost in USD: as it reported it, else its tokens at its model's
        price; None when either is unknown."""
        if usage is None:
            return None
        if usage.cost_usd is not None:
            return usage.cost_usd
        if usage.parts:  # a panel: each model at its price, unknown if one is unknown
            costs = [self.cost(part) for part in usage.parts]
            return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)
        price = self.table.get(usage.model or "")
        if price is None or usage.input_tokens is None or usage.output_tokens is None:
            return None
        return price.cost(usage.input_tokens, usage.output_tokens)
