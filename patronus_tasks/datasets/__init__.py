"""The Patronus SDK 0.1.x's ``patronus.datasets``, here: ``from patronus_tasks.datasets
import Row, Dataset, read_csv`` where a program had ``from patronus.datasets import ...``.

May import: `define`, `patronus` (remote datasets) and the ground modules.
"""

from patronus_tasks.datasets.datasets import (
    Attachment,
    Dataset,
    DatasetLoader,
    Fields,
    RemoteDatasetLoader,
    Row,
    read_csv,
    read_jsonl,
)

__all__ = ["Attachment", "Dataset", "DatasetLoader", "Fields", "RemoteDatasetLoader", "Row",
           "read_csv", "read_jsonl"]
