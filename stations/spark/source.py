"""The ``stations`` data source: its fixed schemas, and which reader or writer serves a
``spark.read`` / ``readStream`` / ``write`` / ``writeStream``."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
)
from pyspark.sql.types import (
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from stations.spark.options import NAME, Config
from stations.spark.read import FilteringReader, StationsReader
from stations.spark.stream_read import StationsStreamReader
from stations.spark.stream_write import StationsStreamWriter
from stations.spark.write import StationsWriter

MESSAGES_SCHEMA = (
    "offset string, msgId string, headers map<string,string>, data string, timestamp timestamp"
)
DLS_SCHEMA = (
    "id string, group string, offset string, msgId string, headers map<string,string>, "
    "data string, deliveryCount int, reason string, error string, deadLetteredAt timestamp"
)


def _messages_struct() -> StructType:
    return StructType(
        [
            StructField("offset", StringType()),
            StructField("msgId", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("data", StringType()),
            StructField("timestamp", TimestampType()),
        ]
    )


def _dls_struct() -> StructType:
    return StructType(
        [
            StructField("id", StringType()),
            StructField("group", StringType()),
            StructField("offset", StringType()),
            StructField("msgId", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("data", StringType()),
            StructField("deliveryCount", IntegerType()),
            StructField("reason", StringType()),
            StructField("error", StringType()),
            StructField("deadLetteredAt", TimestampType()),
        ]
    )


class StationsDataSource(DataSource):
    """``format("stations")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.cfg = Config.parse(options)

    def schema(self) -> str:
        return DLS_SCHEMA if self.cfg.dls else MESSAGES_SCHEMA

    # PySpark refuses a reader with pushFilters unless spark.sql.python.filterPushdown.enabled
    # is set, so only the source that register() installs (and sets it for) pushes filters.
    push_filters = False

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.push_filters and not self.cfg.dls:
            return FilteringReader(self.cfg, self._fixed(schema))
        return StationsReader(self.cfg, self._fixed(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StationsStreamReader(self.cfg, self._fixed(schema))

    def _fixed(self, schema: StructType) -> StructType:
        expected = _dls_struct() if self.cfg.dls else _messages_struct()
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in expected.fields
        ]:
            raise ValueError(
                f"the stations format has a fixed schema ({self.schema()}); "
                "select or cast columns after load() instead of passing a schema"
            )
        return schema

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return StationsWriter(self.cfg, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return StationsStreamWriter(self.cfg, schema, overwrite)


class FilteringStationsDataSource(StationsDataSource):
    """``format("stations")`` whose batch reads push offset and time filters down (see
    ``stations.spark.read.FilteringReader``); ``stations.spark.register`` installs it."""

    push_filters = True
