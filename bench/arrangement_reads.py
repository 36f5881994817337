"""What keyed reads of an arrangement cost when one refresh's join terms ask it for overlapping
sets of keys (as TPC-H's queries ask lineitem for the same changed orders): `--reads` reads of
`--keys` keys each, drawn from a pool of `--pool` keys of the arrangement: from the Parquet files
with decoded row groups kept between reads (KeyedFiles(decoded_bytes=...)) and without, and
from the files' local copies (local_copies; made first, their making timed apart); each read's
rows are checked against pyarrow's own filtered scan of the same files.

    .venv/bin/python -m bench.arrangement_reads /tmp/epochal-bench/profile-10 lineitem l_orderkey

The warehouse is one a bench or step_profile run left behind, with the arrangement built.
"""

from __future__ import annotations

import argparse
import random
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.arrangement_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("warehouse")
    parser.add_argument("input")
    parser.add_argument("key")
    parser.add_argument("--reads", type=int, default=12)
    parser.add_argument("--keys", type=int, default=3_800)
    parser.add_argument("--pool", type=int, default=8_000)
    arguments = parser.parse_args(argv)

    import tempfile

    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    from epochal.keyed.arrangements import Arrangements
    from epochal.keyed.keyed_files import DECODED_BYTES, KeyedFiles
    from epochal.keyed.local_copies import LocalCopies

    source = f"{arguments.warehouse}/sources/{arguments.input}"
    probe = Arrangements(f"{arguments.warehouse}/_epochal/arrangements", warehouse=arguments.warehouse)
    commit = probe.chain(source, arguments.key)[0]  # as built: every weight 1, a read is a plain filter
    arranged = DeltaTable(probe.path(source, arguments.key), version=commit.version)
    keys = arranged.to_pyarrow_dataset().to_table(columns=[arguments.key]).column(0)
    random.seed(5)
    pool = random.sample(sorted(set(keys.to_pylist())), arguments.pool)
    draws = [pa.array(sorted(random.sample(pool, arguments.keys)), keys.type) for _ in range(arguments.reads)]
    print(f"{source} by {arguments.key} as of version {commit.to}: {len(keys):,} rows; "
          f"{arguments.reads} reads of {arguments.keys:,} keys from {arguments.pool:,}", flush=True)
    expected = []
    for values in draws:
        table = arranged.to_pyarrow_dataset()
        expected.append(table.to_table(filter=ds.field(arguments.key).isin(values)).num_rows)
    scratch = tempfile.mkdtemp(prefix="epochal-copies-")
    copies = LocalCopies(scratch)
    began = time.perf_counter()
    for fragment in arranged.to_pyarrow_dataset().get_fragments():
        copies.make(f"{probe.path(source, arguments.key)}/{fragment.path}", fragment, arguments.key)
    print(f"  local copies made in {time.perf_counter() - began:.2f} s", flush=True)
    for label, budget, copied in (("row groups decoded once", DECODED_BYTES, None), ("every read decodes", 0, None),
                                  ("local copies", 0, copies)):
        arrangements = Arrangements(probe.root, files=KeyedFiles(copies=copied, decoded_bytes=budget),
                                    warehouse=probe.warehouse)
        seconds = []
        for values, rows in zip(draws, expected):
            began = time.perf_counter()
            found = arrangements.read(source, commit.to, arguments.key, values, False, list(commit.columns),
                                      lambda *_: None)
            seconds.append(time.perf_counter() - began)
            assert found is not None and found.num_rows == rows, (label, rows, found and found.num_rows)
        print(f"  {label:<26} {sum(seconds):6.2f} s  (first {seconds[0]:.2f} s, later mean "
              f"{sum(seconds[1:]) / max(1, len(seconds) - 1):.2f} s)", flush=True)
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
