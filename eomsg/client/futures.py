"""Futures a call hands back without an event loop: one that failed already (a refusal
given where a result was promised), and the one item of a batch's result. Apart from the
consumers (which need asyncio), so that an embedded command that only publishes or looks
never imports asyncio."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


def failed(error: BaseException) -> Future[Any]:
    """A future that has failed with ``error``: a refusal given in the future a call
    returns rather than raised, the same on both backends."""
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


def first(batch: Future[list[T]]) -> Future[T]:
    """The future of a one-item batch's result (the node answers batches)."""
    one: Future[T] = Future()

    def done(f: Future[list[T]]) -> None:
        error = f.exception()
        if error is not None:
            one.set_exception(error)
        else:
            one.set_result(f.result()[0])

    batch.add_done_callback(done)
    return one
