"""Running rows, with no Prefect: the checked set-up (`spec`), every option declared once
(`options`), the row logic (`runner`), the one row loop and the backends that drive it
(`loop`), threads for sync steps (`threads`), who watches (`observers`), the recording
levels (`modes`), and a background loop the process finishes before it exits
(`background`).

May import: `define`, `record` and the ground modules; no Prefect, nothing of `results`
(pyproject's import contracts).
"""
