"""What shaping a driver commit's MERGE rows costs (storage/commits.py): the copies a table holds of
each deleted row (`copies_of`), the `delete` and `insert` rows of a multiset change
(`multiset_rows`) and the `upsert` and `delete` rows of a keyed one (`keyed_rows`), beside the
delta-rs MERGE that applies the multiset change, for a table of `--rows` rows shaped as TPC-H Q10's
output (eight columns: a key, strings and decimals) and changes of `--changed` of its rows.

    .venv/bin/python -m bench.merge_rows [--rows 38000] [--changed 1000 10000 30000] [--repeat 3]

Prints the median seconds of each part per change size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from decimal import Decimal


def q10_shaped(rows: int):
    import pyarrow as pa

    keys = list(range(rows))
    return pa.table({
        "c_custkey": pa.array(keys, pa.int64()),
        "c_name": [f"Customer#{k:09d}" for k in keys],
        "revenue": pa.array([Decimal(k * 37 % 100_000) / 100 for k in keys], pa.decimal128(38, 4)),
        "c_acctbal": pa.array([Decimal(k % 9_999) / 100 for k in keys], pa.decimal128(15, 2)),
        "n_name": [("FRANCE", "GERMANY", "JAPAN", None)[k % 4] for k in keys],
        "c_address": [f"address {k * 7919 % rows}" for k in keys],
        "c_phone": [f"{10 + k % 25}-{k % 1000:03d}-{k % 10000:04d}" for k in keys],
        "c_comment": [f"comment {k % 997} of a customer" for k in keys],
    })


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=38_000)
    parser.add_argument("--changed", type=int, nargs="+", default=[1_000, 10_000, 30_000])
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    from epochal.graph import WEIGHT
    from epochal.storage import commits

    table = q10_shaped(arguments.rows)
    columns = table.column_names
    print(f"{'changed':>8} {'copies_of':>10} {'multiset_rows':>14} {'keyed_rows':>11} {'merge':>7}")
    for changed in arguments.changed:
        old = table.slice(0, changed)
        new = old.set_column(7, "c_comment", pc.binary_join_element_wise(old.column("c_comment"), "again", " "))
        change = pa.concat_tables([old.append_column(WEIGHT, pa.array([-1] * changed, pa.int64())),
                                   new.append_column(WEIGHT, pa.array([1] * changed, pa.int64()))])
        deleted = change.filter(pc.less(change.column(WEIGHT), 0))
        seconds = {"copies_of": [], "multiset_rows": [], "keyed_rows": [], "merge": []}
        for _ in range(arguments.repeat):
            started = time.perf_counter()
            copies = commits.copies_of(table, deleted, columns)
            seconds["copies_of"].append(time.perf_counter() - started)
            started = time.perf_counter()
            rows = commits.multiset_rows(change, columns, copies)
            seconds["multiset_rows"].append(time.perf_counter() - started)
            started = time.perf_counter()
            commits.keyed_rows(change, columns, ["c_custkey"])
            seconds["keyed_rows"].append(time.perf_counter() - started)
            with tempfile.TemporaryDirectory() as path:
                write_deltalake(path, table, configuration={"delta.enableChangeDataFeed": "true"})
                started = time.perf_counter()
                commits.merge_multiset(DeltaTable(path), rows, columns, "bench/merge_rows", 1, "bench")
                seconds["merge"].append(time.perf_counter() - started)
        medians = {k: statistics.median(v) for k, v in seconds.items()}
        print(f"{changed:>8} {medians['copies_of']:>10.3f} {medians['multiset_rows']:>14.3f} "
              f"{medians['keyed_rows']:>11.3f} {medians['merge']:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
