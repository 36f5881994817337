"""The deployment tests' driver: one Spark session on the master it is given (`spark://`, `sc://`
or `local[*]`), the TPC-H sources at scale 0.01 loaded into the warehouse it is given (a folder or
an `s3a://` URI), a few derived tables, a first epoch and two hourly change batches, each epoch
compared with the full recompute. It prints one JSON answer prefixed with tests.deploy.MARK:

    {"techniques": {"tpch_q01": ["rescan", "incremental", "incremental"], ...},
     "mismatches": ["after batch 1: tpch_q03", ...], "seconds": 73.2}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.deploy import MARK

LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"
SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def _pairs(values: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for value in values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--tables", default="tpch_q01,tpch_q03,tpch_q06")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--conf", action="append", default=[], help="a Spark conf key=value")
    parser.add_argument("--storage-option", action="append", default=[], help="a delta-rs option key=value")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        answer = drive(args)
    except Exception as error:  # noqa: BLE001 - the test judges it
        traceback.print_exc()
        answer = {"error": type(error).__name__, "message": str(error)}
    answer["seconds"] = round(time.monotonic() - started, 1)
    sys.stdout.write(MARK + json.dumps(answer, default=str) + "\n")
    sys.stdout.flush()


def drive(args) -> dict:
    from epochal import Engine
    from ops.changes import ChangeGenerator
    from ops.tpch import load_tpch
    from resources.session import SparkSettings, delta_spark_session, is_s3, storage_options_for
    from tests.support import mismatched_tables

    spark = delta_spark_session(SparkSettings(master=args.master, shuffle_partitions=2, ui=False,
                                              driver_memory="3g", extra_conf=_pairs(args.conf),
                                              s3=is_s3(args.warehouse)))
    tables = args.tables.split(",")
    load_tpch(spark, args.warehouse, 0.01, LOADED_AT)
    options = _pairs(args.storage_option) or storage_options_for(args.warehouse)
    engine = Engine(spark, args.warehouse, storage_options=options)
    for source in SOURCES:
        engine.source(source, clock="logical")
    engine.define_all({name: (SQL / f"{name}.sql").read_text() for name in tables})
    techniques = {name: [] for name in tables}
    mismatches = []

    def epoch(until: datetime, label: str) -> None:
        for report in engine.refresh(until=until):
            techniques[report.table].append(report.technique)
        mismatches.extend(f"{label}: {name}" for name in mismatched_tables(engine, tables))

    epoch(LOADED_AT + timedelta(minutes=15), "first epoch")
    generator = ChangeGenerator(spark, args.warehouse, seed=5, fraction=0.01)
    for index in range(1, args.batches + 1):
        generator.apply_batch(index, LOADED_AT + timedelta(hours=index - 1, minutes=30))
        epoch(LOADED_AT + timedelta(hours=index), f"after batch {index}")
    answer = {"techniques": techniques, "mismatches": mismatches, "spark": spark.version}
    spark.stop()
    return answer


if __name__ == "__main__":
    main()
