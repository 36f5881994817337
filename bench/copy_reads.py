"""Reads of some keys' rows from local copies (epochal/keyed/local_copies.py) that the page cache
does not hold: the file memory-mapped as Arrow maps it, against a mapping advised for random
reads (MADV_RANDOM, no read-around of `read_ahead_kb` per page fault).

Each round drops the page cache (root only), reads the rows of `--keys` random keys from every
copy in the folder, as `LocalCopies.rows` does (the key column at the rows its blocks' bounds
admit, then the selected columns at the rows holding a key), and reports the seconds and what the
kernel read (/proc/vmstat pgpgin).

    python -m bench.copy_reads <warehouse>/_epochal/local_copies/<folder> --key l_orderkey --keys 1500 15000
"""

from __future__ import annotations

import argparse
import glob
import time

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from epochal.keyed.local_copies import mapped_for_random_reads, rows_in_copy


def _read_kib() -> int:
    with open("/proc/vmstat") as vmstat:
        return next(int(line.split()[1]) for line in vmstat if line.startswith("pgpgin "))


def _drop_caches() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as caches:
        caches.write("3")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--key", required=True, help="the arrangement's key column")
    parser.add_argument("--keys", type=int, nargs="+", default=[1500, 15000])
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args(argv)
    files = sorted(glob.glob(f"{arguments.folder}/*.arrow"))
    bounds = {f: np.load(f + ".bounds.npy") for f in files}
    low = min(int(b[0].min()) for b in bounds.values())
    high = max(int(b[1].max()) for b in bounds.values())
    schema = ipc.open_file(pa.memory_map(files[0])).schema
    key = arguments.key
    columns = schema.names
    opened = {"pa.memory_map": pa.memory_map, "MADV_RANDOM": mapped_for_random_reads}
    print(f"{len(files)} copies, keys {low}..{high}, key column {key}")
    for count in arguments.keys:
        for round_ in range(arguments.rounds):
            keys = np.unique(np.random.default_rng([count, round_]).integers(low, high + 1, count)).astype(np.int64)
            for name, opener in opened.items():
                _drop_caches()
                before, began = _read_kib(), time.perf_counter()
                rows = sum(rows_in_copy(opener(f), bounds[f], key, keys, False, columns).num_rows for f in files)
                print(f"{count:>6} keys round {round_} {name:>14}: {time.perf_counter() - began:6.2f} s, "
                      f"{(_read_kib() - before) / 1024:8.1f} MiB read, {rows} rows", flush=True)


if __name__ == "__main__":
    main()
