"""Where the verdict of a request on a connection goes: one batched publish's or
delete's (a :class:`Completion`), and a batch's, made of its frames' (:func:`concat`)."""

from __future__ import annotations

import asyncio
from typing import Protocol, TypeVar

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Completion(Protocol[T_contra]):
    """Where one batched publish or delete's verdict goes: an asyncio future, or the
    synchronous client's :class:`~eomsg.client.sync.Ack`."""

    def done(self) -> bool: ...
    def set_result(self, value: T_contra, /) -> None: ...
    def set_exception(self, error: BaseException, /) -> None: ...


def concat(
    loop: asyncio.AbstractEventLoop, parts: list[asyncio.Future[list[T]]]
) -> asyncio.Future[list[T]]:
    """One future for the concatenated results of ``parts``: the first error wins (and
    every part's is retrieved: each is this future's)."""
    out: asyncio.Future[list[T]] = loop.create_future()
    if not parts:
        out.set_result([])
        return out
    left = [len(parts)]

    def done(part: asyncio.Future[list[T]]) -> None:
        left[0] -= 1
        error = None if part.cancelled() else part.exception()
        if out.done():
            return
        if part.cancelled():
            out.cancel()
        elif error is not None:
            out.set_exception(error)
        elif left[0] == 0:
            out.set_result([r for p in parts for r in p.result()])

    for p in parts:
        p.add_done_callback(done)
    return out
