"""What an arrangement's Parquet settings cost its build: TPC-H lineitem at a scale (the bench's
cached load) arranged by Spark by one key, with the columns all 22 TPC-H queries read, once per
(row-group rows, codec) asked for, through `Arrangements.build` with those settings in place of
the module's, then the local copies the engine makes of its files; prints each build's and
copies' seconds and the files' size.

    .venv/bin/python -m bench.arrangement_writes 10 [--key l_partkey] [--settings 2000:snappy 2000:uncompressed]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.arrangement_writes", description=__doc__.split("\n\n")[0])
    parser.add_argument("scale", type=float)
    parser.add_argument("--key", default="l_partkey")
    parser.add_argument("--settings", nargs="+", default=["2000:snappy", "2000:uncompressed", "16000:uncompressed"],
                        help="row-group rows:codec, each built in turn")
    parser.add_argument("--work", default="/tmp/epochal-bench")
    arguments = parser.parse_args(argv)

    from bench.__main__ import start_session, tpch_warehouse
    from bench.arrangement_builds import EVERY_QUERY
    from epochal.keyed import arrangements
    from epochal.keyed.arrangements import Arrangements
    from epochal.keyed.keyed_files import KeyedFiles
    from epochal.keyed.local_copies import LocalCopies

    spark = start_session("12g")
    base = Path(arguments.work) / f"tpch-{arguments.scale:g}"
    if not (base / "sources" / "lineitem" / "_delta_log").exists():
        shutil.rmtree(tpch_warehouse(spark, Path(arguments.work), arguments.scale, "writes"), ignore_errors=True)
    source = str(base / "sources" / "lineitem")
    spark_writes = dict(arrangements.SPARK_WRITE_CONFS)
    try:
        for setting in arguments.settings:
            rows, codec = setting.split(":")
            arrangements.SPARK_WRITE_CONFS.update({"parquet.block.row.count.limit": rows,
                                               "spark.sql.parquet.compression.codec": codec})
            scratch = Path(tempfile.mkdtemp(prefix="arrangement-writes-"))
            try:
                built = Arrangements(str(scratch / "arranged"), driver_build_rows=0)
                began = time.perf_counter()
                built.build(spark, source, 0, arguments.key, EVERY_QUERY)
                build = time.perf_counter() - began
                files = KeyedFiles(copies=LocalCopies(str(scratch / "copies")))
                began = time.perf_counter()
                files.copy_table(built.path(source, arguments.key), arguments.key)
                copies = time.perf_counter() - began
                size = sum(p.stat().st_size for p in (scratch / "arranged").rglob("*.parquet"))
                print(f"row groups of {rows} rows, {codec}: build {build:.1f} s, local copies {copies:.1f} s, "
                      f"{size / 1e9:.2f} GB", flush=True)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        arrangements.SPARK_WRITE_CONFS.clear()
        arrangements.SPARK_WRITE_CONFS.update(spark_writes)
        spark.stop()


if __name__ == "__main__":
    main()
