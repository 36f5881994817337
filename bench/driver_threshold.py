"""Where a driver commit stops paying: a keyed change of n rows MERGEd into a Delta table of
`--table-rows` rows, through delta-rs on the driver (the change collected from Spark as Arrow, then
driver_commits.merge_keyed) against Spark's MERGE (writes.apply_keyed), in one session, for a
range of n. `Engine(driver_rows=...)` is the n below which the driver path is chosen.

    .venv/bin/python -m bench.driver_threshold [--table-rows 1000000] [--changes 1000 10000 50000 200000]
"""

from __future__ import annotations

import argparse
import tempfile
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.driver_threshold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, nargs="+", default=[1_000, 10_000, 50_000, 200_000])
    parser.add_argument("--repeat", type=int, default=2)
    arguments = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from epochal.graph import WEIGHT
    from epochal.protocol.writes import apply_keyed, keyed_source, write_identity
    from epochal.storage import commits as driver_commits
    from resources.session import SparkSettings, delta_spark_session

    spark = delta_spark_session(SparkSettings(shuffle_partitions=4, ui=False))
    root = tempfile.mkdtemp(prefix="epochal-driver-threshold-")
    columns, key = ["k", "v", "s"], ["k"]

    def table(name: str) -> str:
        path = f"{root}/{name}"
        (spark.range(arguments.table_rows).select(F.col("id").alias("k"), (F.col("id") * 2).alias("v"),
                                                  F.concat(F.lit("row "), F.col("id")).alias("s"))
         .write.format("delta").option("delta.enableChangeDataFeed", "true").save(path))
        return path

    def change(n: int, seq: int):
        # n/2 updates of existing keys, n/2 new keys (+rows), as a step's keyed change
        updates = spark.range(n // 2).select((F.col("id") * 7 % arguments.table_rows).alias("k"))
        inserts = spark.range(n - n // 2).select((F.col("id") + arguments.table_rows * (seq + 1)).alias("k"))
        rows = updates.unionByName(inserts).select(
            "k", (F.col("k") + seq).alias("v"), F.concat(F.lit("seq "), F.lit(seq)).alias("s"),
            F.lit(1).cast("long").alias(WEIGHT))
        return rows.persist()

    print("| change rows | driver: collect s | driver: merge s | driver total s | Spark MERGE s | faster |")
    print("|---:|---:|---:|---:|---:|---|")
    for n in arguments.changes:
        driver, spark_side, collect, merge = [], [], [], []
        for attempt in range(arguments.repeat):
            frame = change(n, attempt)
            frame.count()
            path = table(f"driver-{n}-{attempt}")
            began = time.perf_counter()
            rows = frame.toArrow()
            collected = time.perf_counter()
            target = driver_commits.open_unwritten(path, "bench", 1)
            driver_commits.merge_keyed(target, driver_commits.keyed_rows(rows, columns, key), columns, key,
                                       "bench", 1, "{}")
            done = time.perf_counter()
            collect.append(collected - began)
            merge.append(done - collected)
            driver.append(done - began)
            path = table(f"spark-{n}-{attempt}")
            began = time.perf_counter()
            apply_keyed(spark, path, keyed_source(frame, columns, key), columns, key,
                        write_identity(spark, "bench", 1, "{}"))
            spark_side.append(time.perf_counter() - began)
            frame.unpersist()
        best = min(driver), min(spark_side)
        print(f"| {n} | {min(collect):.2f} | {min(merge):.2f} | {best[0]:.2f} | {best[1]:.2f} | "
              f"{'driver' if best[0] < best[1] else 'Spark'} |", flush=True)
    print(f"\ntarget table: {arguments.table_rows} rows; best of {arguments.repeat}")


if __name__ == "__main__":
    main()
