"""Import-linter contract types of this project's own (pyproject's ``contract_types``;
`lint-imports` run from the repository's root finds this module).

The house leaves ``if TYPE_CHECKING:`` imports out of its graph: its layers are about what
a module loads when it runs, and an annotation loads nothing. A circle is another matter:
two modules that name each other, even one of them for its type hints alone, are one
piece cut in two (`prefect/recorder/poster.py` and `taskruns.py` were, issue 49). So the
circle contract reads its own graph, type hints kept.
"""

from __future__ import annotations

from typing import Any

import grimp
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.domain.contract import ContractCheck


class AcyclicWithTypeHints(AcyclicSiblingsContract):
    """``acyclic_siblings``, counting the imports made for type hints alone (~0.1 s for
    its graph, built uncached: the session's cache holds the graph without them)."""

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots: Any = self.session_options["root_packages"]
        hinted = grimp.build_graph(*roots, include_external_packages=False,
                                   exclude_type_checking_imports=False, cache_dir=None)
        return super().check(hinted, verbose)
