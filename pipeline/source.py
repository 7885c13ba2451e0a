"""The ``dq`` data source: wires options to the batch reader, stream reader and writer.

Spark pickles the source and calls these factories on the driver; each factory parses
its options once (``dq.pipeline.options``) so bad options fail at planning time.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from dq.pipeline.batch import BatchReader
from dq.pipeline.options import ReadOptions, WriteOptions
from dq.pipeline.reading import SCHEMA
from dq.pipeline.stream import StreamReader
from dq.pipeline.writer import Writer

__all__ = ["DqDataSource"]


class DqDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("dq")``, ``spark.readStream.format("dq")``, ``df.write.format("dq")``."""

    @classmethod
    def name(cls) -> str:
        return "dq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return Writer(WriteOptions.parse(self.options), schema)
