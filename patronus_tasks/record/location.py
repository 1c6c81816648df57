"""Where results live: a local folder, or a prefix in object storage (``results_dir``).

`Location.of` takes a path, a ``file://`` URL, or an object-store URL: ``s3://``,
``gs://`` and ``abfs://`` through pyarrow's own file systems, any other scheme fsspec
knows (``az://`` with adlfs, say) through fsspec. Paths and ``file://`` URLs stay plain
`Path`s, so local results keep using local files (unbuffered appends, ``os.replace``)
with no file-system layer in between.

Object stores have no append and no atomic rename, but one object is written whole or
not at all: readers see the old object or the new one, never part of one. So every
write there is one whole object at its final name (`write_bytes`, `atomic_output`), and
appends are the caller's to turn into objects of their own (`can_append`).

Credentials come from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...)
or the URL's query (``?endpoint_override=host:port&scheme=http``): `str()` shows the
URL with secret values as ``***``, and `link` has no query at all.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit
from urllib.request import url2pathname

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.http import SECRET_NAME, redact_url

#: How often a remote file is read again when it changed while read (`Location.read_bytes`).
_REREADS = 5

#: Query parameters whose values are never shown (``secret_key``, ``session_token``,
#: ``access_key``, an Azure ``sas_token``/``account_key``, a signed URL's ``sig``, ...).
#: ``url`` safe to show (`http.redact_url`: one rule for every URL this package names).
redact = redact_url


def _without_password(url: str) -> str:
    """``url`` less a ``user:password@`` (an abfs ``container@account`` stays)."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=host)) if at and ":" in user else url


def _secrets(url: str) -> list[str]:
    parts = urlsplit(url)
    found = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if SECRET_NAME.search(k) and v]
    return found + ([parts.password] if parts.password else [])


def scrub(text: str, url: str) -> str:
    """``text`` (an error message, say) with every secret of ``url`` in it as ``***``."""
    for secret in _secrets(url):
        text = text.replace(secret, "***").replace(quote(secret, safe=""), "***")
    return text


def _fsspec_filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """A scheme pyarrow lacks, through fsspec; the query's parameters are its options."""
    import fsspec

    parts = urlsplit(url)
    try:
        fs, path = fsspec.core.url_to_fs(urlunsplit((*parts[:3], "", "")),
                                         **dict(parse_qsl(parts.query)))
    except ImportError as exc:  # fsspec names the package: "Install adlfs to access ..."
        raise ConfigError(f"results_dir {redact(url)} needs a package that is not installed: "
                          f"{scrub(str(exc), url)}") from None
    except ValueError as exc:
        raise ConfigError(f"results_dir {redact(url)}: {scrub(str(exc), url)}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), str(path)


def _filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """The file system and path of an object-store URL."""
    try:
        return pafs.FileSystem.from_uri(url)
    except pa.ArrowInvalid as exc:
        if "Unrecognized filesystem type" in str(exc):
            return _fsspec_filesystem(url)
        message = scrub(str(exc), url)
    except (OSError, ValueError) as exc:
        message = scrub(str(exc), url)
    raise ConfigError(f"results_dir {redact(url)} cannot be opened: {message.splitlines()[0]}")


class Location:
    """A folder or file of results: ``local`` (a `Path`) or a key in an object store."""

    __slots__ = ("_fs", "_key", "_query", "_shown", "local")

    def __init__(self, local: Path | None = None, *, fs: pafs.FileSystem | None = None,
                 key: str = "", shown: str = "", query: str = "") -> None:
        self.local = local
        self._fs, self._key = fs, key.rstrip("/")
        self._shown, self._query = shown.rstrip("/"), query  # both free of secrets

    @classmethod
    def of(cls, value: str | os.PathLike[str] | Location) -> Location:
        """A path, a ``file://`` URL or an object-store URL, as a `Location`."""
        if isinstance(value, Location):
            return value
        text = os.fspath(value)
        if isinstance(value, Path) or "://" not in text:
            return cls(Path(text))
        parts = urlsplit(text)
        if parts.scheme == "file":
            return cls(Path(url2pathname(parts.path)))
        fs, key = _filesystem(text)
        shown = redact(urlunsplit((*parts[:3], "", "")))
        return cls(fs=fs, key=key, shown=shown, query=urlsplit(redact(text)).query)

    def at(self, url: str) -> Location:
        """The object at ``url`` (a `link`, which has no settings) in this one's store: its
        file system and settings (an endpoint given in the query, say) when ``url`` is of
        the same scheme, else ``url`` opened on its own."""
        parts = urlsplit(url)
        if self.local is not None or not url.startswith(self._shown.split("://", 1)[0] + "://"):
            return Location.of(url)
        key = f"{parts.netloc}{parts.path}"
        return Location(fs=self._fs, key=key, shown=url.rstrip("/"), query=self._query)

    # Names -------------------------------------------------------------------------

    def __truediv__(self, name: str) -> Location:
        if self.local is not None:
            return Location(self.local / name)
        return Location(fs=self._fs, key=f"{self._key}/{name}", shown=f"{self._shown}/{name}",
                        query=self._query)

    @property
    def name(self) -> str:
        return self.local.name if self.local is not None else self._key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        if self.local is not None:
            return Location(self.local.parent)
        return Location(fs=self._fs, key=self._key.rsplit("/", 1)[0],
                        shown=self._shown.rsplit("/", 1)[0], query=self._query)

    def with_name(self, name: str) -> Location:
        return self.parent / name

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def can_append(self) -> bool:
        """Whether a file here can be appended to (local files), or each append must be
        an object of its own (object stores have no append)."""
        return self.local is not None

    def __str__(self) -> str:
        """For people: the path, or the URL with its secrets as ``***``."""
        if self.local is not None:
            return str(self.local)
        return f"{self._shown}?{self._query}" if self._query else self._shown

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    @property
    def link(self) -> str:
        """A link to it: a ``file://`` URL, or the object's URL without credentials or query."""
        return self.local.resolve().as_uri() if self.local is not None else _without_password(self._shown)

    def _id(self) -> tuple[Any, ...]:
        return (self.local, self._shown, self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and self._id() == other._id()

    def __hash__(self) -> int:
        return hash(self._id())

    # Reading -----------------------------------------------------------------------

    def _info(self) -> pafs.FileInfo:
        assert self._fs is not None
        return self._fs.get_file_info(self._key)

    def exists(self) -> bool:
        if self.local is not None:
            return self.local.exists()
        return bool(self._info().type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        if self.local is not None:
            return self.local.is_file()
        return bool(self._info().type == pafs.FileType.File)

    def read_bytes(self) -> bytes:
        if self.local is not None:
            return self.local.read_bytes()
        assert self._fs is not None
        for _ in range(_REREADS):
            data, size = self._read_object()
            if size is None or len(data) == size:  # no size told (some fsspec stores): as read
                return data
        raise OSError(f"{self} kept changing while it was read; read it again")

    def _read_object(self) -> tuple[bytes, int | None]:
        """The object's bytes, and its size once read. pyarrow reads the size it asked
        before (a HEAD), then that many bytes: an object replaced in between comes back
        cut short or padded with NULs (seen against a manifest rewritten while read).
        A GET is whole, so bytes as many as the object holds after are one version."""
        assert self._fs is not None
        with self._fs.open_input_stream(self._key) as stream:
            data = bytes(stream.read())
        return data, self._fs.get_file_info(self._key).size

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_table(self, columns: list[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
        """The Parquet file here (``columns``: only these; ``schema``: read as this)."""
        if self.local is not None:
            return pq.read_table(self.local, columns=columns, schema=schema)
        return pq.read_table(self._key, columns=columns, schema=schema, filesystem=self._fs)

    def row_groups(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """The Parquet file here, a row group at a time (``columns``: only these)."""
        with contextlib.ExitStack() as stack:
            if self.local is not None:
                source: Any = self.local
            else:
                assert self._fs is not None
                source = stack.enter_context(self._fs.open_input_file(self._key))
            file = stack.enter_context(pq.ParquetFile(source))
            for i in range(file.num_row_groups):
                yield file.read_row_group(i, columns=columns)

    def read_schema(self) -> pa.Schema:
        """The Parquet file's schema (its footer only)."""
        if self.local is not None:
            return pq.read_schema(self.local)
        return pq.read_schema(self._key, filesystem=self._fs)

    def iterdir(self) -> list[Location]:
        """What is directly in this folder (nothing when there is no such folder)."""
        if self.local is not None:
            return [Location(p) for p in self.local.iterdir()] if self.local.is_dir() else []
        assert self._fs is not None
        found = self._fs.get_file_info(pafs.FileSelector(self._key, allow_not_found=True))
        return [self / info.base_name for info in sorted(found, key=lambda i: i.path)]

    def glob(self, pattern: str) -> list[Location]:
        """What matches ``pattern`` (``*`` and ``?`` within a name; ``a/*/b`` by level)."""
        if self.local is not None:
            return [Location(p) for p in self.local.glob(pattern)]
        level: list[Location] = [self]
        for part in pattern.split("/"):
            level = [c for loc in level for c in loc.iterdir() if fnmatch.fnmatchcase(c.name, part)]
        return level

    # Writing -----------------------------------------------------------------------

    def write_bytes(self, data: bytes) -> None:
        """Replace the file with ``data`` at once: readers see the old one or the new one."""
        with self.atomic_output() as out:
            if isinstance(out, str):
                Path(out).write_bytes(data)
            else:
                out.write(data)

    def write_table(self, table: pa.Table) -> None:
        """Replace the file with ``table`` as Parquet, at once (see `write_bytes`)."""
        with self.atomic_output() as out:
            pq.write_table(table, out)

    @contextlib.contextmanager
    def atomic_output(self) -> Iterator[str | pa.NativeFile]:
        """Where to write the file's new content (a path or a stream, for pyarrow); it
        replaces the file only when the block ends without an error."""
        if self.local is None:
            with self._remote_output() as stream:
                yield stream
            return
        tmp = self.local.with_name(self.local.name + ".tmp")
        try:
            yield str(tmp)
            os.replace(tmp, self.local)
        finally:
            tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _remote_output(self) -> Iterator[pa.NativeFile]:
        # The object appears when the stream closes (one PUT, or a multipart upload
        # completed at close); pyarrow cannot abort it, so an error deletes what closing
        # published. A killed process never completes the upload: no object.
        assert self._fs is not None
        stream = self._fs.open_output_stream(self._key)
        try:
            yield stream
        except BaseException:
            with contextlib.suppress(Exception):
                stream.close()
                self._fs.delete_file(self._key)
            raise
        stream.close()

    def mkdir(self) -> None:
        """Make the folder (object stores have none: a prefix exists with its objects)."""
        if self.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)

    def remove(self) -> None:
        """Delete the file or the folder with all it holds; nothing when there is none."""
        if self.local is not None:
            if self.local.is_dir():
                shutil.rmtree(self.local, ignore_errors=True)
            else:
                self.local.unlink(missing_ok=True)
            return
        assert self._fs is not None
        with contextlib.suppress(FileNotFoundError):
            if self._info().type == pafs.FileType.Directory:
                self._fs.delete_dir(self._key)  # one bulk delete per 1000 objects on S3
            else:
                self._fs.delete_file(self._key)

    def check_writable(self) -> None:
        """Make the folder and write a probe in it; `ConfigError` when that fails."""
        try:
            self.mkdir()
            if self.local is not None:
                # A probe of its own: Dask workers check one folder at once, and a shared
                # name let one delete the other's probe before it did.
                with tempfile.NamedTemporaryFile(dir=self.local, prefix=".write-test-"):
                    return
            probe = self / f".write-test-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.remove()
        except OSError as exc:
            # The store's message (no credentials: this holds none, see `of`).
            reason = exc.strerror or str(exc).splitlines()[0]
            raise ConfigError(
                f"results directory {self} is not writable ({reason}). Pass results_dir= "
                "(or set PATRONUS_TASKS_RESULTS_DIR) to a writable folder or bucket."
            ) from None


def link_target(path: Path | Location) -> str:
    """What a link to results at ``path`` points at (see `Location.link`)."""
    return Location.of(path).link
