"""What one Spark action over change-sized local relations costs, by session setting: a join of
two local relations (2,000 and 500 rows, as a join term over a change batch and a restricted
read) aggregated and collected as Arrow, and the same join cut with localCheckpoint (eager, and
lazy followed by a collect), the shapes an incremental step runs dozens of times. Median of
`--repeat` rounds over every setting in turn, after a warm-up, in one session.

    .venv/bin/python -m bench.action_cost [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from decimal import Decimal

SETTINGS = {
    "defaults (the engine's session)": {},
    "AQE off": {"spark.sql.adaptive.enabled": "false"},
    "whole-stage codegen off": {"spark.sql.codegen.wholeStage": "false"},
    "AQE and codegen off": {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false"},
    "no broadcast joins": {"spark.sql.autoBroadcastJoinThreshold": "-1"},
    "1 shuffle partition": {"spark.sql.shuffle.partitions": "1"},
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.action_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    arguments = parser.parse_args(argv)

    import pyarrow as pa
    from pyspark.sql import functions as F

    from epochal.sessions import session_confs
    from resources.session import SparkSettings, delta_spark_session

    spark = delta_spark_session(SparkSettings(shuffle_partitions=4, ui=False))
    change = pa.table({"k": list(range(2000)), "v": [Decimal(i) / 4 for i in range(2000)],
                       "s": [f"s{i % 7}" for i in range(2000)], "__w": [1] * 2000})
    partners = pa.table({"pk": list(range(0, 2000, 4)), "name": [f"n{i % 11}" for i in range(500)]})

    def frames():
        return (spark.createDataFrame(change.cast(pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.decimal128(12, 2)),
                                                             pa.field("s", pa.string()), pa.field("__w", pa.int64())]))),
                spark.createDataFrame(partners))

    def joined():
        a, b = frames()
        return a.join(b, a.k == b.pk).select("k", "v", "s", "name", "__w")

    shapes = {
        "join, aggregate, toArrow": lambda: joined().groupBy("name").agg(F.sum(F.col("v") * F.col("__w"))).toArrow(),
        "join, localCheckpoint(eager)": lambda: joined().localCheckpoint(eager=True),
        "join, localCheckpoint(lazy), toArrow": lambda: joined().localCheckpoint(eager=False).toArrow(),
        "join, toArrow": lambda: joined().toArrow(),
    }
    print(f"| setting | {' | '.join(shapes)} |")
    print("|---|" + "---:|" * len(shapes))
    for shape in shapes.values():  # the JVM's own warm-up (JIT), before any setting is timed
        for _ in range(arguments.repeat):
            shape()
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(arguments.repeat):  # round-robin, so drift on a shared machine hits every setting alike
        for name, confs in SETTINGS.items():
            with session_confs(spark, confs):
                for shape, run in shapes.items():
                    began = time.perf_counter()
                    run()
                    seconds.setdefault((name, shape), []).append(time.perf_counter() - began)
    for name in SETTINGS:
        print(f"| {name} | " + " | ".join(f"{statistics.median(seconds[name, shape]) * 1000:.0f} ms"
                                          for shape in shapes) + " |", flush=True)

if __name__ == "__main__":
    main()
