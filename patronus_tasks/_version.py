"""The package's version: here only (pyproject.toml reads it, the manifest records it)."""

__version__ = "0.1.0"
