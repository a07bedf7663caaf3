"""Topic names, subscription patterns and the matcher that routes one to the other.

A topic is a ``/``-separated list of non-empty levels (``orders/eu/new``). A pattern is
the same with two wildcards, each a whole level: ``*`` matches exactly one level and ``>``
(last level only) matches one or more trailing levels. So ``orders/>`` matches
``orders/eu`` and ``orders/eu/new`` but not ``orders``.

The :class:`Matcher` is a trie over pattern levels: matching walks the topic's levels
once, so its cost depends on the depth of the topic and the wildcards on the way, not on
how many subscriptions exist. Results are cached per topic because producers publish to
few distinct topics; the cache is dropped whenever subscriptions change.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from functools import lru_cache
from typing import Generic, TypeVar

from eomsg.core.text import is_text
from eomsg.errors import InvalidPattern, InvalidTopic

MAX_TOPIC_LENGTH = 255
MAX_LEVELS = 32
ONE_LEVEL = "*"
TRAILING = ">"

# A level is printable text without the separator, wildcards or white space — nor the
# controls and direction marks a terminal would act on when it shows the topic.
_LEVEL = re.compile(r"[^\s/*>\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]+")

K = TypeVar("K", bound=Hashable)


def _check_common(
    text: str, what: str, error: type[InvalidTopic] | type[InvalidPattern]
) -> list[str]:
    if not isinstance(text, str) or not text:
        raise error(f"{what} must be non-empty text, e.g. 'orders/eu/new'")
    if not is_text(text):
        raise error(f"{what} {text!r} is not UTF-8 text")
    if len(text) > MAX_TOPIC_LENGTH:
        raise error(f"{what} {text[:40]!r}… is longer than {MAX_TOPIC_LENGTH} characters")
    levels = text.split("/")
    if len(levels) > MAX_LEVELS:
        raise error(f"{what} {text!r} has more than {MAX_LEVELS} levels")
    if "" in levels:
        raise error(f"{what} {text!r} has an empty level: no leading, trailing or double '/'")
    return levels


@lru_cache(maxsize=4096)  # producers publish to few distinct topics; errors aren't cached
def validate_topic(topic: str) -> str:
    """Return ``topic`` unchanged if it is a valid topic name, else raise InvalidTopic."""
    for level in _check_common(topic, "topic", InvalidTopic):
        if not _LEVEL.fullmatch(level):
            raise InvalidTopic(
                f"topic {topic!r}: level {level!r} may not contain '*', '>', spaces, control "
                "characters or direction marks (wildcards belong in subscription patterns)"
            )
    return topic


def validate_pattern(pattern: str) -> str:
    """Return ``pattern`` unchanged if it is a valid subscription pattern, else raise."""
    levels = _check_common(pattern, "pattern", InvalidPattern)
    for i, level in enumerate(levels):
        if level == TRAILING:
            if i != len(levels) - 1:
                raise InvalidPattern(f"pattern {pattern!r}: '>' may only be the last level")
        elif level != ONE_LEVEL and not _LEVEL.fullmatch(level):
            raise InvalidPattern(
                f"pattern {pattern!r}: level {level!r} is not valid; a wildcard ('*' or '>') "
                "must be a whole level"
            )
    return pattern


def pattern_regex(pattern: str) -> str:
    """A regular expression that fully matches exactly the topics ``pattern`` matches.

    Used to filter stored topics inside the database (``inspect log --topic``).
    """
    parts = []
    for level in validate_pattern(pattern).split("/"):
        if level == ONE_LEVEL:
            parts.append(r"[^/]+")
        elif level == TRAILING:
            parts.append(r"[^/]+(/[^/]+)*")
        else:
            parts.append(re.escape(level))
    return "/".join(parts)


class _Node(Generic[K]):
    __slots__ = ("children", "here", "star", "tail")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        self.star: _Node[K] | None = None
        self.here: set[K] = set()  # subscribers whose pattern ends at this node
        self.tail: set[K] = set()  # subscribers of '>' placed at this node

    def empty(self) -> bool:
        return not (self.children or self.star or self.here or self.tail)


class Matcher(Generic[K]):
    """Maps topics to the set of subscriber keys whose patterns match them.

    Keys are opaque (queue names, link names). Adding the same (pattern, key) twice is
    idempotent, as is removing one that is absent.
    """

    CACHE_SIZE = 8192

    def __init__(self) -> None:
        self._root: _Node[K] = _Node()
        self._cache: dict[str, frozenset[K]] = {}
        self._count = 0

    def __len__(self) -> int:
        """Number of (pattern, key) subscriptions held."""
        return self._count

    def add(self, pattern: str, key: K) -> None:
        node = self._root
        levels = validate_pattern(pattern).split("/")
        for level in levels[:-1]:
            node = self._child(node, level)
        last = levels[-1]
        bucket = node.tail if last == TRAILING else self._child(node, last).here
        if key not in bucket:
            bucket.add(key)
            self._count += 1
            self._cache.clear()

    def remove(self, pattern: str, key: K) -> None:
        levels = validate_pattern(pattern).split("/")
        path = [self._root]
        for level in levels[:-1]:
            nxt = self._step(path[-1], level)
            if nxt is None:
                return
            path.append(nxt)
        last = levels[-1]
        if last == TRAILING:
            bucket = path[-1].tail
        else:
            end = self._step(path[-1], last)
            if end is None:
                return
            path.append(end)
            bucket = end.here
        if key in bucket:
            bucket.discard(key)
            self._count -= 1
            self._cache.clear()
            self._prune(path, levels)

    def match(self, topic: str) -> frozenset[K]:
        """Keys subscribed to ``topic`` (which must already be a valid topic)."""
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        levels = topic.split("/")
        n = len(levels)
        found: set[K] = set()
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == n:
                found |= node.here
                continue
            if node.tail:
                found |= node.tail
            child = node.children.get(levels[i])
            if child is not None:
                stack.append((child, i + 1))
            if node.star is not None:
                stack.append((node.star, i + 1))
        result = frozenset(found)
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        self._cache[topic] = result
        return result

    @staticmethod
    def _child(node: _Node[K], level: str) -> _Node[K]:
        if level == ONE_LEVEL:
            if node.star is None:
                node.star = _Node()
            return node.star
        child = node.children.get(level)
        if child is None:
            child = node.children[level] = _Node()
        return child

    @staticmethod
    def _step(node: _Node[K], level: str) -> _Node[K] | None:
        return node.star if level == ONE_LEVEL else node.children.get(level)

    @staticmethod
    def _prune(path: list[_Node[K]], levels: list[str]) -> None:
        """Drop trie nodes left empty by a removal, so churn does not leak memory."""
        for depth in range(len(path) - 1, 0, -1):
            node, parent, level = path[depth], path[depth - 1], levels[depth - 1]
            if not node.empty():
                return
            if level == ONE_LEVEL:
                parent.star = None
            else:
                del parent.children[level]
