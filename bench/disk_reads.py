"""What a read from this machine's disk costs, past the page cache: sequential throughput and the
latency of random 4 KiB reads, both with O_DIRECT over the files given (TPC-H's Parquet, say), so
two machines' driver-side steps can be compared where a keyed read waits on the disk (a Parquet
row group of a file with no local copy, or a copy's page evicted).

    .venv/bin/python -m bench.disk_reads /tmp/epochal-bench/tpch-10/sources/lineitem [--reads 2000]

Prints MiB/s read sequentially in 1 MiB blocks (up to 1 GiB) and the median and 95th percentile
milliseconds of `--reads` random aligned 4 KiB reads spread over the files.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import time
from pathlib import Path

BLOCK = 4096
SEQUENTIAL_BLOCK = 1 << 20
SEQUENTIAL_LIMIT = 1 << 30


def data_files(roots: list[str]) -> list[Path]:
    """The files under `roots` (each a file or a folder) of at least one sequential block."""
    found = []
    for root in map(Path, roots):
        candidates = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        found += [p for p in candidates if p.stat().st_size >= SEQUENTIAL_BLOCK]
    return found


def sequential_mib_per_second(files: list[Path]) -> float:
    """MiB/s of 1 MiB O_DIRECT reads through the files in turn, up to SEQUENTIAL_LIMIT bytes."""
    buffer = mmap.mmap(-1, SEQUENTIAL_BLOCK)
    read = 0
    started = time.perf_counter()
    for path in files:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while read < SEQUENTIAL_LIMIT:
                got = os.readv(descriptor, [buffer])
                if got <= 0:
                    break
                read += got
        finally:
            os.close(descriptor)
        if read >= SEQUENTIAL_LIMIT:
            break
    return read / (1 << 20) / (time.perf_counter() - started)


def random_read_milliseconds(files: list[Path], reads: int, seed: int | None = None) -> list[float]:
    """Milliseconds of each of `reads` aligned 4 KiB O_DIRECT reads at random places of the files."""
    chooser = random.Random(seed)
    buffer = mmap.mmap(-1, BLOCK)
    sizes = [(path, path.stat().st_size // BLOCK) for path in files]
    descriptors = {path: os.open(path, os.O_RDONLY | os.O_DIRECT) for path, _ in sizes}
    try:
        seconds = []
        for _ in range(reads):
            path, blocks = chooser.choice(sizes)
            offset = chooser.randrange(blocks) * BLOCK
            started = time.perf_counter()
            os.preadv(descriptors[path], [buffer], offset)
            seconds.append((time.perf_counter() - started) * 1000)
        return seconds
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="files or folders to read (TPC-H's Parquet, say)")
    parser.add_argument("--reads", type=int, default=2000, help="random 4 KiB reads")
    arguments = parser.parse_args()
    files = data_files(arguments.paths)
    if not files:
        raise SystemExit(f"no file of at least {SEQUENTIAL_BLOCK} bytes under {', '.join(arguments.paths)}")
    print(f"{len(files)} files, {sum(p.stat().st_size for p in files) / (1 << 30):.2f} GiB")
    print(f"sequential, 1 MiB O_DIRECT reads: {sequential_mib_per_second(files):.0f} MiB/s")
    latencies = random_read_milliseconds(files, arguments.reads)
    percentiles = statistics.quantiles(latencies, n=20)
    print(f"random 4 KiB O_DIRECT reads ({arguments.reads}): median {statistics.median(latencies):.3f} ms, "
          f"95th percentile {percentiles[-1]:.3f} ms, mean {statistics.fmean(latencies):.3f} ms")


if __name__ == "__main__":
    main()
