"""Spark options refused on the driver in one line (a review of 2026-11-29), without a Spark
session: a boolean msgIdColumn made every row's id "True" or "False" (all but two rows were
stored as "duplicates"), and an offset with a sub-position the server never issues was read
as another message's offset."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from stations.spark.options import Config  # noqa: E402
from stations.spark.rows import RowShape  # noqa: E402


def test_a_boolean_msg_id_column_is_refused() -> None:
    schema = StructType(
        [
            StructField("ok", BooleanType()),
            StructField("data", StringType()),
            StructField("n", LongType()),
        ]
    )
    cfg = Config.parse({"station": "s", "msgIdColumn": "ok"})
    with pytest.raises(ValueError, match="msgIdColumn 'ok' is a boolean column"):
        RowShape.of(cfg, schema, is_json=True)
    fine = Config.parse({"station": "s", "msgIdColumn": "n"})
    assert RowShape.of(fine, schema, is_json=True).id_column == "n"


@pytest.mark.parametrize("option", ["startingOffset", "endingOffset"])
def test_an_offset_with_a_sub_position_is_refused(option: str) -> None:
    with pytest.raises(ValueError, match=f"option {option}: not an offset the server issues"):
        Config.parse({"station": "s", option: "0000000000000010_0000000000000005"})
    Config.parse({"station": "s", option: "0000000000000010_0000000000000000"})
