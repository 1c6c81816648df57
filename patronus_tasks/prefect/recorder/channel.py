"""Messages between an experiment's process and its recorder process: pickled frames.

Each frame is a 4-byte length and a pickle. Both ends are this package's own code, run
by the same Python from the same installation (the recorder process is started by the
experiment's process), so pickle carries its dataclasses as they are.
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

_HEADER = struct.Struct("!I")


def write_frame(out: IO[bytes], message: object) -> int:
    """Write ``message`` as one frame (and flush); return the bytes written."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_HEADER.pack(len(data)))
    out.write(data)
    out.flush()
    return len(data) + _HEADER.size


def read_frame(source: IO[bytes]) -> Any:
    """The next message (its type is the protocol's: the reader's to say); `EOFError` once
    the other end closed its side."""
    head = _read_exactly(source, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    return pickle.loads(_read_exactly(source, size))


def _read_exactly(source: IO[bytes], size: int) -> bytes:
    data = source.read(size)
    if data is None or len(data) < size:
        raise EOFError("the other end closed the channel")
    return data
