"""The ``dq`` data source: wires options to the batch reader, stream reader and writer.

Spark pickles the source and calls these factories on the driver; each factory parses
its options once (``pipeline.options``) so bad options fail at planning time.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pipeline.batch import BatchReader
from pipeline.options import ReadOptions, WriteOptions
from pipeline.reading import SCHEMA
from pipeline.stream import StreamReader
from pipeline.writer import Writer

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
