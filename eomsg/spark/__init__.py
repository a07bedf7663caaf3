"""eomsg on Apache Spark: the ``eomsg`` data source and the replay job.

Needs the ``spark`` extra (``pip install 'eomsg[spark]'``) and Java 17 or newer.
"""

from eomsg.spark.source import EomsgDataSource, register

__all__ = ["EomsgDataSource", "register"]
