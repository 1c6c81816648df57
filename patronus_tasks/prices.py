"""What model calls cost: the dated table of public prices this package knows, and how a
call's cost is found (see `define.prices`). Give your own with ``prices=`` of an experiment."""

from patronus_tasks.define.prices import (
    DEFAULT_PRICES,
    PRICE_SOURCES,
    PRICES_AS_OF,
    Price,
    PriceTable,
)

__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "PRICE_SOURCES", "Price", "PriceTable"]
