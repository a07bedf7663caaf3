"""The hot path declared once: publishing, fetching, deleting and releasing have frames of
their own rather than being declared operations (:mod:`eomsg.core.operations`), and their
one declaration is the :class:`~eomsg.client.broker.Broker` protocol. Every
implementation — the client over a socket, its asyncio core, the embedded client, a
transaction's publish, and the node's components that run them — takes exactly the
declared arguments (names, kinds, defaults), the node adding only who calls, keyword-only
and last, as a declared operation's ``caller`` does. mypy checks the types of the
classes that subclass ``Broker``; this holds the rest to the same declaration."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import eomsg
from eomsg.client.aio import AsyncClient, connect_async
from eomsg.client.broker import Broker
from eomsg.client.sync import Client, connect
from eomsg.client.transaction import Transaction
from eomsg.embedded.local import LocalClient
from eomsg.node.delivery import Delivery
from eomsg.node.ingress import Ingress

# Declared in Broker; implemented by every client, and the node's part where it has one.
HOT_PATH = {
    "publish": (Ingress, Transaction),
    "publish_async": (),
    "publish_batch": (Ingress,),
    "publish_batch_async": (Ingress,),
    "fetch": (Delivery,),
    "delete": (Delivery,),
    "delete_async": (Delivery,),
    "release": (Delivery,),
    "consumer": (),
}
CLIENTS = (Client, AsyncClient, LocalClient)
# What the node's side adds: who calls (the server fills them in from the connection).
CALLER = {"holder", "flow"}


def shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A signature's parameters as (name, kind, default), ``self`` left out."""
    parameters = inspect.signature(function).parameters.values()
    return [(p.name, p.kind, p.default) for p in parameters if p.name != "self"]


@pytest.mark.parametrize("name", sorted(HOT_PATH))
def test_every_client_takes_the_declared_arguments(name: str) -> None:
    declared = shape(getattr(Broker, name))
    for client in CLIENTS:
        assert shape(getattr(client, name)) == declared, f"{client.__name__}.{name}"


@pytest.mark.parametrize("name", sorted(HOT_PATH))
def test_the_node_takes_them_and_only_adds_who_calls(name: str) -> None:
    declared = shape(getattr(Broker, name))
    for part in HOT_PATH[name]:
        if part is Transaction:  # a transaction's publish: the same arguments, staged
            assert shape(part.publish) == declared
            continue
        got = shape(getattr(part, name))
        assert got[: len(declared)] == declared, f"{part.__name__}.{name}"
        extra = got[len(declared) :]
        assert {n for n, _, _ in extra} <= CALLER, f"{part.__name__}.{name} adds {extra}"
        assert all(kind is inspect.Parameter.KEYWORD_ONLY for _, kind, _ in extra)


def test_the_async_client_is_a_coroutine_of_each_and_the_others_are_not() -> None:
    for name in HOT_PATH:
        if name in ("publish_async", "publish_batch_async", "delete_async", "consumer"):
            continue
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name


def test_connecting_takes_the_same_arguments_either_way() -> None:
    assert eomsg.connect is connect
    assert shape(connect) == shape(connect_async) == shape(Client.__init__)
