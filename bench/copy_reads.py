"""Reads of some keys' rows from local copies (epochal/keyed/local_copies.py) that the page cache
does not hold: the copy mapped for random reads (MADV_RANDOM, no read-around of `read_ahead_kb`
per page fault) and read page fault by page fault, against the same mapping whose read first asks
the kernel for the pages it will touch (MADV_WILLNEED, `MappedCopy.prefetch`), as
`LocalCopies.rows` does: a thousand ranges to a process_madvise(2) call, and with `--beside`, also
one Python `mmap.madvise` call a range, which holds the interpreter's lock while the kernel queues
the reads.

Each round drops the page cache (root only), reads the rows of `--keys` keys drawn from the
copies' own keys from every copy in the folder (the key column at the rows its blocks' bounds
admit, then `--columns` at the rows holding a key), and reports the seconds, what the kernel read
(/proc/vmstat pgpgin) and the major page faults the read waited on. `--beside` runs a thread of pure Python beside each
read, as the epoch's other steps run beside a step's read, and reports how much of its pace it kept
(1.00: the read never held it up).

    python -m bench.copy_reads <warehouse>/_epochal/local_copies/<folder> --key l_orderkey --keys 1500 15000 \
        [--columns l_orderkey l_extendedprice ...]

`--make <Parquet files>` first makes the copies of those files into a folder under `<folder>` (an
arrangement's files, or any file sorted by `--key`, such as tpchgen-cli's lineitem) and reads those;
`--short-bytes` makes them with another bound on the strings packed into the rows
(packed_rows.SHORT_BYTES).
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import sys
import threading
import time

import numpy as np
import pyarrow.dataset as ds

from epochal.keyed import packed_rows
from epochal.keyed.local_copies import LocalCopies, MappedCopy, rows_in_copy
from epochal.keyed.packed_rows import Layout


def _read_kib() -> int:
    with open("/proc/vmstat") as vmstat:
        return next(int(line.split()[1]) for line in vmstat if line.startswith("pgpgin "))


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


class _AdviceHoldingTheLock(MappedCopy):
    """The advice through Python's `mmap.madvise`, which holds the interpreter's lock."""

    def willneed(self, starts, lengths) -> None:
        self.willneed_each(starts, lengths)


class _Beside(threading.Thread):
    """Pure Python work beside a read: its pace while the read runs against its pace alone."""

    def __init__(self):
        super().__init__(daemon=True)
        self.loops, self.stopped = 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            sum(range(200))
            self.loops += 1

    @classmethod
    def pace(cls, seconds: float) -> float:
        """Loops a second, alone."""
        beside = cls()
        beside.start()
        time.sleep(seconds)
        beside.stopped.set()
        beside.join()
        return beside.loops / seconds


def _drop_caches() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as caches:
        caches.write("3")


def _made(folder: str, parquet_files: list[str], key: str) -> str:
    """The folder of the copies of `parquet_files` (made under `folder` unless there)."""
    copies = LocalCopies(folder, max_bytes=1 << 50)
    made = set()
    for path in parquet_files:
        fragment = next(iter(ds.dataset(path, format="parquet").get_fragments()))
        began = time.perf_counter()
        made.add(os.path.dirname(copies.make(os.path.abspath(path), fragment, key)))
        print(f"copy of {path}: {time.perf_counter() - began:.1f} s", flush=True)
    if len(made) != 1:
        raise SystemExit(f"the copies went to {len(made)} folders: give files of one folder")
    return made.pop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--key", required=True, help="the arrangement's key column")
    parser.add_argument("--keys", type=int, nargs="+", default=[1500, 15000])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--columns", nargs="+", default=None, help="the columns read (default: every column)")
    parser.add_argument("--beside", action="store_true",
                        help="a thread of pure Python beside each read; adds the advice through mmap.madvise")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval (seconds; Python's default 0.005)")
    parser.add_argument("--make", nargs="+", default=None, metavar="PARQUET",
                        help="make the copies of these Parquet files under the folder first, and read those")
    parser.add_argument("--short-bytes", type=int, default=None,
                        help="with --make: strings and binaries of at most this many bytes are packed into the rows")
    arguments = parser.parse_args(argv)
    if arguments.short_bytes is not None:
        packed_rows.SHORT_BYTES = arguments.short_bytes
    if arguments.switch_interval is not None:
        sys.setswitchinterval(arguments.switch_interval)
    if arguments.make:
        arguments.folder = _made(arguments.folder, arguments.make, arguments.key)
    files = sorted(glob.glob(f"{arguments.folder}/*.arrow"))
    bounds = {f: np.load(f + ".bounds.npy") for f in files}
    present = np.unique(np.concatenate([b[0] for b in bounds.values()]))  # each block's lowest key
    low, high = int(present[0]), int(present[-1])
    schema = Layout.stored(MappedCopy(files[0]).reader().schema).schema
    key = arguments.key
    columns = arguments.columns or schema.names
    opened = {"MADV_RANDOM": lambda path: MappedCopy(path, prefetching=False),
              "+ WILLNEED": MappedCopy}
    if arguments.beside:
        opened["+ WILLNEED, lock held"] = _AdviceHoldingTheLock
        alone = _Beside.pace(2.0)
    print(f"{len(files)} copies, {sum(os.path.getsize(f) for f in files) / 2**20:.0f} MiB, keys {low}..{high}, "
          f"key column {key}, packed {', '.join(Layout.stored(MappedCopy(files[0]).reader().schema).packed)}")
    for count in arguments.keys:
        for round_ in range(arguments.rounds):
            keys = np.unique(np.random.default_rng([count, round_]).choice(present, count)).astype(np.int64)
            for name, opener in opened.items():
                _drop_caches()
                beside = _Beside() if arguments.beside else None
                if beside:
                    beside.start()
                before, faults, began = _read_kib(), _major_faults(), time.perf_counter()
                rows = sum(rows_in_copy(opener(f), bounds[f], key, keys, False, columns).num_rows for f in files)
                seconds = time.perf_counter() - began
                kept = ""
                if beside:
                    beside.stopped.set()
                    beside.join()
                    kept = f", the thread beside kept {beside.loops / seconds / alone:.2f} of its pace"
                print(f"{count:>6} keys round {round_} {name:>21}: {seconds:6.2f} s, "
                      f"{(_read_kib() - before) / 1024:8.1f} MiB read, {_major_faults() - faults} major faults, "
                      f"{rows} rows{kept}", flush=True)


if __name__ == "__main__":
    main()
