"""Arrow tables as bytes on the wire: the Arrow IPC stream format, which any Arrow
reader (Spark's included) takes without copying rows through Python objects."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eomsg.errors import RemoteProtocolError

if TYPE_CHECKING:  # imported when a table is carried: a client that never does starts fast
    import pyarrow as pa


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def from_ipc(data: bytes) -> pa.Table:
    """The table ``to_ipc`` wrote; RemoteProtocolError if ``data`` is not an Arrow IPC stream."""
    import pyarrow as pa

    if not isinstance(data, bytes):
        raise RemoteProtocolError("expected Arrow IPC bytes")
    try:
        with pa.ipc.open_stream(data) as reader:
            return reader.read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise RemoteProtocolError(f"malformed Arrow IPC stream: {e}") from e
