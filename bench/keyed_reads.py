"""What a read of some keys' rows costs on the driver (`SharedReads`'s restricted read), against
the size of the table, for tables laid out sorted by the key in row groups of a given size.

A join's change batch asks its partners for the rows of about a thousand random keys. Random keys
touch every file, so only row groups small against the table bound the read: with row groups of
R rows, k keys read about k x R rows at any size. This builds TPC-H-shaped tables (lineitem's
l_orderkey, l_extendedprice, l_discount, l_shipdate; each order key copied `--scales` times)
sorted by the key, writes them with delta-rs in row groups of `--row-groups` rows, and times the
restricted read of `--keys` random keys (median of `--repeat`), beside pyarrow's `isin` filter
alone (which prunes no row group).

    python -m bench.keyed_reads --scales 1 10 --row-groups 2000 10000
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc


def _lineitem(rows_per_scale: int, scale: int, seed: int) -> pa.Table:
    import numpy as np

    rng = np.random.default_rng(seed)
    n = rows_per_scale * scale
    return pa.table({
        "l_orderkey": pa.array(np.sort(rng.integers(0, n // 4, n))),
        "l_extendedprice": pa.array(rng.random(n) * 1e5),
        "l_discount": pa.array(rng.random(n) / 10),
        "l_shipdate": pc.cast(pa.array(rng.integers(8000, 10000, n).astype("int32")), pa.date32()),
    })


def _timed(action, repeat: int) -> tuple[float, object]:
    seconds, result = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        result = action()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds), result


def main(argv=None) -> None:
    import pyarrow.dataset as ds
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    from epochal.keyed.shared_reads import SharedReads

    parser = argparse.ArgumentParser(prog="python -m bench.keyed_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--row-groups", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--rows", type=int, default=6_000_000, help="rows per unit of scale")
    parser.add_argument("--keys", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", default="/tmp/epochal-bench/keyed-reads")
    arguments = parser.parse_args(argv)
    print("scale | rows | row group | keys | restricted s | rows found | isin alone s")
    for scale in arguments.scales:
        table = _lineitem(arguments.rows, scale, seed=scale)
        rng = random.Random(7)
        keys = tuple(sorted(rng.sample(pc.unique(table.column("l_orderkey")).to_pylist(), arguments.keys)))
        for group in arguments.row_groups:
            path = Path(arguments.work) / f"s{scale}-rg{group}"
            shutil.rmtree(path, ignore_errors=True)
            write_deltalake(str(path), table, writer_properties=WriterProperties(max_row_group_size=group))
            reads = SharedReads(driver_rows=10_000_000)
            restricted, found = _timed(lambda: reads._scan_for_keys(str(path), 0, "l_orderkey", keys, False),
                                       arguments.repeat)
            dataset = DeltaTable(str(path)).to_pyarrow_dataset()
            condition = ds.field("l_orderkey").isin(pa.array(keys, pa.int64()))
            alone, expected = _timed(lambda: dataset.to_table(filter=condition), arguments.repeat)
            assert found is not None and found.num_rows == expected.num_rows, "the restricted read lost rows"
            print(f"{scale} | {table.num_rows} | {group} | {len(keys)} | {restricted:.3f} | {found.num_rows} | "
                  f"{alone:.3f}")


if __name__ == "__main__":
    import os
    import sys

    main()
    sys.stdout.flush()
    os._exit(0)  # delta-rs's runtime aborts at interpreter teardown ("terminate called without an active exception")
