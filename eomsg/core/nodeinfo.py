"""A node's identity and health at a glance (``eomsg node info``): who it is, which
eomsg and which formats it runs, how long it has run, where it keeps its data and serves
it, its links and its disk. What an orchestrator or an operator checks first."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node, as ``eomsg node info`` shows it. Times are seconds; sizes bytes."""

    name: str
    version: str  # of eomsg, the package the node runs
    pid: int
    started_at: float  # wall clock, when the node opened its store
    uptime: float  # seconds since then (measured on the node's monotonic clock)
    data_dir: str
    listening: tuple[str, ...]  # the daemon's addresses; none when embedded in a command
    schema_version: int  # of the store
    protocol_version: int  # of the wire it is served on (0: embedded, not served)
    queues: int
    links: int
    links_up: int  # of them, connected now
    in_doubt: int  # prepared transactions whose coordinator is gone
    disk_free: int  # on the disk holding the data directory
    disk_reserve: int  # below it the node takes no new messages (0: never)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["listening"] = list(self.listening)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeInfo:
        """What a node sent; ValueError if a field is missing or of the wrong kind."""
        try:
            values = {f.name: d[f.name] for f in fields(cls)}
        except KeyError as e:
            raise ValueError(f"node info without {e.args[0]}") from None
        values["listening"] = tuple(values["listening"])
        for f in fields(cls):
            v, kind = values[f.name], f.type
            ok = (
                all(type(x) is str for x in v)
                if f.name == "listening"
                else type(v) is str
                if kind == "str"
                else type(v) is int
                if kind == "int"
                else type(v) in (int, float)
            )
            if not ok:
                raise ValueError(f"node info's {f.name} is not a {kind}")
        return cls(**values)

    @property
    def disk_state(self) -> str:
        """``ok``, or ``full`` once the free disk is under the reserve."""
        return "full" if self.disk_reserve and self.disk_free < self.disk_reserve else "ok"
