"""Print `Engine.explain` for TPC-H queries over a warehouse holding the TPC-H sources (the plan,
each operator's delta rule and state, and the co-generator restrictions), to see which inputs a
step reads and how. It defines the tables there (nothing is computed), so point it at a copy or at
the bench's cached load:

    .venv/bin/python -m bench.explain_tpch /tmp/epochal-bench/tpch-1 3 21
"""

from __future__ import annotations

import sys


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    root, queries = argv[0], [f"tpch_q{int(q):02d}" for q in argv[1:]]
    from bench.__main__ import bench_engine, start_session

    spark = start_session("4g")
    engine = bench_engine(spark, root, queries)
    for query in queries:
        print(f"== {query}")
        print(engine.explain(query))


if __name__ == "__main__":
    main()
