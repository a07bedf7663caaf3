"""A replay's transformation: decoding the payload, then the user's function or SQL.

Three kinds, told apart when the transform is loaded (so a bad one fails before Spark
starts any work):

- ``module:function`` over rows: ``function(row: dict) -> dict | list[dict] | None``.
  The row has ``seq``, ``id``, ``topic``, ``published_at``, ``headers`` and the decoded
  ``payload``; ``seq``, ``id`` and ``topic`` are added to each output row that lacks
  them. The output columns are ``function.schema`` (a DDL string) if set, else inferred
  from the function's output on the first messages. The module is shipped to executors
  by value, so it need not be installed on them.
- ``module:function`` over a DataFrame, when its first parameter is annotated
  ``DataFrame``: ``function(df) -> DataFrame``.
- SQL (``--sql``): one query over the view ``messages``.

Outputs must keep ``seq``, ``id`` and ``topic``: they name each output row for the sinks.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from eomsg.errors import TransformError, one_line

KEY_COLUMNS = ("seq", "id", "topic")
DECODINGS = ("text", "json", "binary")
INPUT_COLUMNS = ("seq", "id", "topic", "published_at", "headers", "payload")
SAMPLE_ROWS = 200


def _load(ref: str) -> Callable[..., Any]:
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise TransformError(f"transform {ref!r} must be module:function (mypkg.fixes:reprice)")
    if os.getcwd() not in sys.path:  # as `python -m` does: modules beside the user
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise TransformError(
            f"cannot import {module_name!r} for the transform: {one_line(e)}"
        ) from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise TransformError(f"module {module_name!r} has no function {attr!r}")
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return typing.cast(Callable[..., Any], fn)


def _over_dataframe(fn: Callable[..., Any]) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        raise TransformError(f"transform {fn.__name__} must take one argument")
    annotation = params[0].annotation
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1] == "DataFrame"
    return isinstance(annotation, type) and issubclass(annotation, DataFrame)


@dataclass(frozen=True)
class Transform:
    """What a replay does to each message: ``kind`` is ``none``, ``rows``,
    ``dataframe`` or ``sql``; ``ref`` is the function's ``module:function`` or the SQL."""

    kind: str
    ref: str
    decode: str = "text"

    @classmethod
    def load(cls, function: str | None, sql: str | None, decode: str = "text") -> Transform:
        """Check the transform now: import the function, parse nothing yet for SQL."""
        if decode not in DECODINGS:
            raise TransformError(f"--decode {decode!r}: use {', '.join(DECODINGS)}")
        if function and sql:
            raise TransformError("give --transform or --sql, not both")
        if sql is not None:
            if not sql.strip():
                raise TransformError("--sql is empty")
            return cls("sql", sql, decode)
        if function is None:
            return cls("none", "", decode)
        fn = _load(function)
        return cls("dataframe" if _over_dataframe(fn) else "rows", function, decode)

    def describe(self) -> str:
        if self.kind == "none":
            return f"none (payload decoded as {self.decode})"
        if self.kind == "sql":
            return f"SQL over view messages: {self.ref}"
        return f"{self.ref} over {'a DataFrame' if self.kind == 'dataframe' else 'rows'}"

    def apply(self, spark: SparkSession, df: DataFrame) -> DataFrame:
        """The output DataFrame: ``seq``, ``id``, ``topic`` first, then the rest."""
        df = df.select(*INPUT_COLUMNS)
        if self.decode != "binary":  # text, checked: never a string that is not UTF-8
            text = F.col("payload").cast("string")
            df = df.withColumn(
                "payload",
                F.when(
                    text.isNull() | F.expr("is_valid_utf8(CAST(payload AS STRING))"), text
                ).otherwise(
                    F.raise_error(
                        F.concat(
                            F.lit("TransformError: the payload of message "),
                            F.col("seq").cast("string"),
                            F.lit(" is not UTF-8 text: replay with --decode binary"),
                        )
                    )
                ),
            )
        if self.kind == "none":
            out = df
        elif self.kind == "sql":
            df.createOrReplaceTempView("messages")
            try:
                out = spark.sql(self.ref)
            except Exception as e:
                raise TransformError(f"--sql failed: {one_line(e)}") from e
        elif self.kind == "dataframe":
            out = _load(self.ref)(df)
            if not isinstance(out, DataFrame):
                raise TransformError(f"{self.ref} must return a DataFrame")
            out = out.sortWithinPartitions("seq") if "seq" in out.columns else out
        else:
            out = _over_rows(_load(self.ref), self.ref, self.decode, df)
        missing = [c for c in KEY_COLUMNS if c not in out.columns]
        if missing:
            raise TransformError(
                f"the transform's output lacks {', '.join(missing)}: keep seq, id and topic"
            )
        rest = [c for c in out.columns if c not in KEY_COLUMNS]
        return out.select(*KEY_COLUMNS, *rest)


def _outputs(fn: Callable[..., Any], ref: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        result = fn(row)
    except Exception as e:
        raise TransformError(f"{ref} failed on seq {row['seq']}: {one_line(e)}") from e
    if result is None:
        return []
    results = result if isinstance(result, list) else [result]
    out = []
    for item in results:
        if not isinstance(item, dict):
            raise TransformError(f"{ref} must return a dict, a list of dicts or None")
        for key in KEY_COLUMNS:
            item.setdefault(key, row[key])
        out.append(item)
    return out


def _decoded(batch: pa.RecordBatch, decode: str) -> Iterator[dict[str, Any]]:
    """The batch's rows as dicts, the payload decoded; a payload that is not what
    ``decode`` says is a TransformError naming its message and the way out."""
    try:
        rows = batch.to_pylist()
    except UnicodeDecodeError:
        seqs = batch.column("seq").to_pylist()
        payloads = batch.column("payload").cast(pa.binary()).to_pylist()
        bad = next(s for s, p in zip(seqs, payloads, strict=True) if not _is_utf8(p))
        raise TransformError(
            f"the payload of message {bad} is not UTF-8 text: replay with --decode binary"
        ) from None
    for row in rows:
        if decode == "json" and row["payload"] is not None:
            try:
                row["payload"] = json.loads(row["payload"])
            except ValueError as e:
                raise TransformError(
                    f"the payload of message {row['seq']} is not JSON ({one_line(e)}): "
                    "replay with --decode text or binary"
                ) from e
        yield row


def _is_utf8(payload: bytes | None) -> bool:
    try:
        if payload is not None:
            payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _over_rows(fn: Callable[..., Any], ref: str, decode: str, df: DataFrame) -> DataFrame:
    declared = getattr(fn, "schema", None)
    if declared is not None:
        key_fields = [f for f in df.schema.fields if f.name in KEY_COLUMNS]
        user = StructType.fromDDL(declared)
        if not isinstance(user, StructType):
            raise TransformError(f"{ref}.schema must list columns, e.g. 'price DOUBLE'")
        schema = StructType(key_fields + [f for f in user.fields if f.name not in KEY_COLUMNS])
        arrow_schema = to_arrow_schema(schema)
    else:
        arrow_schema = _infer(fn, ref, decode, df)
        schema = from_arrow_schema(arrow_schema)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [o for row in _decoded(batch, decode) for o in _outputs(fn, ref, row)]
            try:
                yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise TransformError(
                    f"{ref} returned values that do not fit its columns ({one_line(e)}); "
                    "declare them with a schema attribute"
                ) from e

    return df.mapInArrow(run, schema)


def _infer(fn: Callable[..., Any], ref: str, decode: str, df: DataFrame) -> pa.Schema:
    sample = df.limit(SAMPLE_ROWS).toArrow()
    rows = [
        out
        for batch in sample.to_batches()
        for row in _decoded(batch, decode)
        for out in _outputs(fn, ref, row)
    ]
    if not rows:
        raise TransformError(
            f"cannot infer the columns of {ref} (no output on the first messages): "
            "give the function a schema attribute, e.g. reprice.schema = 'price DOUBLE'"
        )
    try:
        inferred = pa.Table.from_pylist(rows).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TransformError(f"cannot infer the columns of {ref}: {one_line(e)}") from e
    fields = [sample.schema.field(k) for k in KEY_COLUMNS]
    for field in inferred:
        if field.name in KEY_COLUMNS:
            continue
        fields.append(field.with_type(pa.string()) if pa.types.is_null(field.type) else field)
    return pa.schema(fields)
