"""eomsg on Apache Spark: the ``eomsg`` data source and the replay job.

Needs the ``spark`` extra (``pip install 'eomsg[spark]'``) and Java 17 or newer.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Imported on first use (PEP 562): ``python -m eomsg.spark.daemon`` must run before
# anything imports PySpark (see that module).
__all__ = ["EomsgDataSource", "register"]

if TYPE_CHECKING:
    from eomsg.spark.source import EomsgDataSource, register


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("eomsg.spark.source"), name)
        globals()[name] = value
        return value
    if name.isidentifier():  # a submodule, as after its import (eomsg.spark.classes)
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
