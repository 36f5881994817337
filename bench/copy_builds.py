"""What making a local copy of an arrangement's file costs, part by part: the Parquet decode row
group by row group (as `LocalCopies._copy` reads), the same decode many row groups a call, the whole
file in one call, the packing of its rows (packed_rows.py), and `LocalCopies._copy` itself (of the
checkout on PYTHONPATH), each on one thread, alternated `--rounds` times so a noisy machine moves
them alike. The arrangement is lineitem at `scale` by `--key`, built once into `--keep` (reused when
there) from the bench's cached load.

    .venv/bin/python -m bench.copy_builds 1 [--key l_orderkey] [--files 2] [--rounds 3]

Prints seconds per part and file, and their medians.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path


def _seconds(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.copy_builds", description=__doc__.split("\n\n")[0])
    parser.add_argument("scale", type=float)
    parser.add_argument("--key", default="l_orderkey")
    parser.add_argument("--files", type=int, default=2, help="the arrangement's first FILES data files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=64, help="row groups a call in the chunked decode")
    parser.add_argument("--work", default="/tmp/epochal-bench")
    parser.add_argument("--keep", default=None,
                        help="where the arrangement is kept (default: WORK/copy-builds-SCALE-KEY)")
    arguments = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from bench.arrangement_builds import EVERY_QUERY
    from epochal.keyed.local_copies import LocalCopies
    from epochal.keyed.packed_rows import Layout

    kept = Path(arguments.keep or Path(arguments.work) / f"copy-builds-{arguments.scale:g}-{arguments.key}")
    if not any(kept.glob("**/_delta_log")):
        from bench.__main__ import start_session
        from epochal.keyed.arrangements import Arrangements

        base = Path(arguments.work) / f"tpch-{arguments.scale:g}" / "sources" / "lineitem"
        if not (base / "_delta_log").exists():
            parser.error(f"no cached TPC-H load at {base}: run `make bench` at scale {arguments.scale:g} first")
        spark = start_session("12g")
        Arrangements(str(kept), driver_build_rows=0).build(spark, str(base), 0, arguments.key, EVERY_QUERY)
        spark.stop()
    table = str(next(kept.glob("**/_delta_log")).parent)
    dataset = DeltaTable(table).to_pyarrow_dataset()
    fragments = list(dataset.get_fragments())[:arguments.files]

    def by_group(path):
        parquet = pq.ParquetFile(path)
        for group in range(parquet.num_row_groups):
            parquet.read_row_group(group)

    def by_chunk(path):
        parquet = pq.ParquetFile(path)
        for first in range(0, parquet.num_row_groups, arguments.chunk):
            parquet.read_row_groups(range(first, min(first + arguments.chunk, parquet.num_row_groups)),
                                    use_threads=False)

    def whole(path):
        pq.ParquetFile(path).read(use_threads=False)

    def pack(path):
        rows = pq.ParquetFile(path).read(use_threads=False)
        layout = Layout.of(rows.schema, apart=(arguments.key,))
        for batch in rows.combine_chunks().to_batches(max_chunksize=1 << 20):
            layout.pack(batch)

    scratch = Path(tempfile.mkdtemp(prefix="copy-builds-"))
    copies = LocalCopies(str(scratch))

    numbers = itertools.count(1)

    def engine_copy(path, fragment):
        copies._copy(fragment, arguments.key, str(scratch / f"copy-{next(numbers)}.arrow"))

    parts = {"decode by row group": lambda p, f: by_group(p),
             f"decode {arguments.chunk} row groups a call": lambda p, f: by_chunk(p),
             "decode whole file": lambda p, f: whole(p),
             "whole decode + pack": lambda p, f: pack(p),
             "LocalCopies._copy": engine_copy}
    seconds = {name: [] for name in parts}
    for fragment in fragments:
        path = Path(table) / fragment.path
        parquet = pq.ParquetFile(path)
        print(f"{path.name}: {parquet.metadata.num_rows:,} rows, {parquet.num_row_groups:,} row groups, "
              f"{path.stat().st_size / 2**20:,.0f} MiB, {parquet.metadata.num_columns} columns", flush=True)
    for round_ in range(arguments.rounds):
        for name, part in parts.items():
            taken = sum(_seconds(lambda: part(f"{table}/{fragment.path}", fragment)) for fragment in fragments)
            seconds[name].append(taken)
            print(f"  round {round_ + 1} {name:<32} {taken:7.2f} s", flush=True)
        for leftover in scratch.glob("copy-*"):
            leftover.unlink()
    print(f"medians over {arguments.rounds} rounds, {len(fragments)} files ({pa.__version__=}):")
    for name, values in seconds.items():
        print(f"  {name:<32} {statistics.median(values):7.2f} s")


if __name__ == "__main__":
    main()
