"""Shared test helpers: multiset comparison of a derived table with its full recompute, and
writing real Delta commits (inserts, deletes, updates) to synthetic source tables."""

from __future__ import annotations

import glob
import math
import os
from collections import Counter
from datetime import datetime, timezone

from epochal.changes import quoted
from epochal.protocol.writes import delta_path
from epochal.storage.deltalog import delta_rs_reads_alike

# The tests' JVMs are short-lived and run thousands of tiny plans: C1-compiled code only and the
# parallel collector cut the JVM's CPU and the wall time of two concurrent test_differential runs
# (bench/RESULTS.md); the JIT's second tier would repay its compile time only in long runs.
# C1 alone shrinks the JVM's default code cache from 240 MB to 48 MB, which a test JVM fills within
# two minutes: the JIT is then disabled, and a class defined after that (a lambda's adapter) fails
# with VirtualMachineError, which Spark's executor treats as fatal and exits the whole JVM (CI lost a
# test worker's session this way). Hence the cache at its tiered default size.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC -XX:ReservedCodeCacheSize=240m"


def child_environment(**variables: str) -> dict[str, str]:
    """The environment for a test's child process that starts its own Spark driver (the demo, the
    Dagster CLI): this one, with `variables`, and the tests' JVM options added to EPOCHAL_SPARK_CONF."""
    confs = [os.environ.get("EPOCHAL_SPARK_CONF", ""), f"spark.driver.extraJavaOptions={TEST_JAVA_OPTIONS}"]
    return {**os.environ, **variables, "EPOCHAL_SPARK_CONF": ";".join(filter(None, confs))}


RELATIVE_TOLERANCE = 1e-9  # DOUBLE sums drift under add and subtract; DECIMAL must match exactly


def _normalize(value):
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"  # equal to itself, as Spark's grouping and set operations hold it
        if math.isinf(value):
            return value
        return float(f"{value:.9g}")  # relative tolerance of ~1e-9
    if isinstance(value, datetime) and value.tzinfo is not None:  # delta-rs: aware; Spark: naive, session zone UTC
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def arrow_rows(rows: list[tuple], schema):
    """`rows` (tuples in the order of `schema`, a Spark StructType) as the Arrow table Spark's
    toArrow would give, built on the driver: the tests' inputs without a Spark job each."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.Table.from_pylist([dict(zip(schema.names, row)) for row in rows], schema=to_arrow_schema(schema))


def local_frame(spark, rows: list[tuple], schema, slices: int = 2):
    """`rows` as a DataFrame of local data, in `slices` partitions as `parallelize` slices them
    (a write makes that many files, so a DELETE or UPDATE may leave one alone). Built from Arrow:
    `createDataFrame` of Python rows is a Python RDD, computed by Python worker processes every
    time it is read."""
    import pyarrow as pa

    data = arrow_rows(rows, schema)
    bounds = [len(rows) * i // slices for i in range(slices + 1)]
    chunks = [data.slice(low, high - low) for low, high in zip(bounds, bounds[1:]) if high > low]
    return spark.createDataFrame(pa.concat_tables(chunks) if chunks else data, schema=schema)


def as_multiset(frame) -> Counter:
    return Counter(tuple(_normalize(v) for v in row) for row in frame.collect())


def multiset_diff(engine, name: str) -> str | None:
    """None when the table equals its recompute as a multiset; otherwise a readable difference."""
    got, want = as_multiset(engine.read(name)), as_multiset(engine.recompute(name))
    if got == want:
        return None
    extra, missing = got - want, want - got
    return (
        f"table {name}: {sum(extra.values())} rows too many, {sum(missing.values())} missing\n"
        f"  too many: {sorted(extra.items(), key=str)[:10]}\n  missing: {sorted(missing.items(), key=str)[:10]}"
    )


def stored_rows(engine, name: str) -> Counter:
    """The table as of its last epoch, read by delta-rs (no Spark job; the stored files are what
    is compared, not the engine's reading of them)."""
    from deltalake import DeltaTable

    table = engine.table(name)
    last = table.ledger.last_committed()
    if last is None:
        return Counter()
    data = DeltaTable(table.path, version=last.output_version,
                      storage_options=engine.storage_options).to_pyarrow_table()
    return Counter(tuple(_normalize(v) for v in row) for row in
                   zip(*(data.column(f.name).to_pylist() for f in table.schema.fields)))


class Oracle:
    """Every table's SQL run in full by Spark over its inputs at its last epoch's versions: what
    `Engine.recompute` runs, with each input version read once per check and shared, as a local
    relation, by the tables that read it.

    The inputs are read by delta-rs (no Spark job) rather than Spark's Delta reader, which
    rebuilds the snapshot of every new version in three jobs: over test_differential's first test
    that was a large share of its time (bench/RESULTS.md). Spark's reader stays the
    referee of what delta-rs reads: `run_epochs` checks every version of every source and derived
    table (feed_problems) against Spark's change feed, and a column-mapped table or one with
    deletion vectors, or one with a reader feature delta-rs lacks, is read by Spark here too."""

    def __init__(self, engine):
        self.engine = engine
        self._inputs: dict[tuple[str, int], object] = {}

    def _input(self, name: str, version: int):
        path, schema = self.engine.path_of(name), self.engine.schema_of(name)
        if (path, version) not in self._inputs:
            self._inputs[(path, version)] = self._read(path, version, schema)
        return self._inputs[(path, version)]

    def _read(self, path: str, version: int, schema):
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError
        from pyspark.sql.pandas.types import to_arrow_schema

        from epochal.changes import read_snapshot

        spark = self.engine.spark
        if version >= 0:
            try:
                table = DeltaTable(path, version=version, storage_options=self.engine.storage_options)
                if delta_rs_reads_alike(table):  # read as Spark reads it: no column mapping, no deletion vectors
                    data = table.to_pyarrow_table(columns=schema.names)
                    if data.num_rows == 0:  # PySpark cannot convert a MAP column of no chunks
                        return spark.createDataFrame([], schema=schema)
                    # one chunk: PySpark's createDataFrame drops the rows after an empty chunk
                    return spark.createDataFrame(data.combine_chunks().cast(to_arrow_schema(schema)), schema=schema)
            except DeltaError:  # a reader feature delta-rs lacks (type widening): Spark's to read
                pass
        return read_snapshot(spark, path, version, schema)

    def frame(self, name: str):
        table = self.engine.table(name)
        last = table.ledger.last_committed()
        if last is None:
            return self.engine.recompute(name)  # raises: not refreshed yet
        frames = {placeholder: self._input(real, last.inputs[real]["to"])
                  for placeholder, real in table.compiled.placeholders.items()}
        return self.engine.spark.sql(table.compiled.recompute_sql, **frames)

    def rows(self, name: str) -> Counter:
        data = self.frame(name).toArrow()
        return Counter(tuple(_normalize(v) for v in row) for row in zip(*(c.to_pylist() for c in data.columns)))


def mismatched_tables(engine, names) -> list[str]:
    """The tables whose contents differ from their recompute as multisets: each recompute is one
    Spark job over the inputs the Oracle read, each table read by delta-rs. (One job over the
    union of every table and recompute made a plan whose optimization cost more than the epochs
    it checked.)"""
    oracle = Oracle(engine)
    return sorted(name for name in names if stored_rows(engine, name) != oracle.rows(name))


def assert_matches_recompute(engine, names=None, context: str = "") -> None:
    names = list(names or engine.tables())
    suspects = mismatched_tables(engine, names)
    problems = [p for p in (multiset_diff(engine, n) for n in suspects) if p]
    assert not problems, (context + "\n" if context else "") + "\n".join(problems)


def sql_equals(column: str, value) -> str:
    """`column = value` as SQL, `IS NULL` for None."""
    if value is None:
        return f"{column} IS NULL"
    return f"{column} = '{value}'" if isinstance(value, str) else f"{column} = {value}"


def sql_literal(value) -> str:
    if value is None:
        return "NULL"
    return f"'{value}'" if isinstance(value, str) else str(value)


class SyntheticSource:
    """A small source Delta table with change data feed, changed by real Delta commits: Spark's
    writes (of `local_frame`s), DELETE and UPDATE."""

    def __init__(self, spark, path: str, schema: str, rows: list[tuple]):
        self.spark, self.path, self.schema = spark, path, schema  # a test may change the schema (DDL)
        (
            self._frame(rows)
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .save(path)
        )

    @classmethod
    def at(cls, spark, path: str, schema: str) -> SyntheticSource:
        """The source already at `path` (a warehouse copied, say), changed from here on."""
        source = cls.__new__(cls)
        source.spark, source.path, source.schema = spark, path, schema
        return source

    def _frame(self, rows: list[tuple]):
        return local_frame(self.spark, rows, self.spark.createDataFrame([], self.schema).schema)  # parsed: no job

    def insert(self, rows: list[tuple]) -> None:
        if rows:
            self._frame(rows).write.format("delta").mode("append").save(self.path)

    # Spark SQL rather than Delta's DeltaTable API: the same commands, which a Spark Connect
    # server with Delta's SQL extension also runs (tests/test_deploy_connect.py)
    def delete(self, condition: str) -> None:
        self.spark.sql(f"DELETE FROM {delta_path(self.path)} WHERE {condition}").collect()

    def update(self, condition: str, assignments: dict[str, str]) -> None:
        sets = ", ".join(f"{quoted(column)} = {value}" for column, value in assignments.items())
        self.spark.sql(f"UPDATE {delta_path(self.path)} SET {sets} WHERE {condition}").collect()

    def rows(self) -> list[tuple]:
        """The table's rows, read by delta-rs where it reads the table as Spark does (a Spark
        read of a version just written rebuilds its snapshot in several jobs; bench/source_writes.py)."""
        from deltalake import DeltaTable as DeltaRsTable

        table = DeltaRsTable(self.path)
        if delta_rs_reads_alike(table):
            data = table.to_pyarrow_table()
            return list(zip(*(column.to_pylist() for column in data.columns)))
        return [tuple(row) for row in self.spark.read.format("delta").load(self.path).collect()]


INSERTED = ("insert", "update_postimage")


def _bag(table) -> Counter:
    import pyarrow as pa

    data = pa.table(table)
    names = [n for n in data.column_names if not n.startswith("_")]
    return Counter(tuple(_normalize(row[n]) for n in names) for row in data.to_pylist())


def feed_problems(path: str, spark=None, first: int = 1) -> list[str]:
    """Versions (from `first`) whose change data feed differs from the bag difference of the
    table's versions around it, duplicates and NULLs included: what a downstream table reads must
    be exactly what changed. The versions are read by delta-rs; the feed by Spark when `spark` is
    given (what the engine reads), else by delta-rs."""
    import pyarrow as pa
    from deltalake import DeltaTable

    latest = DeltaTable(path).version()
    if latest < first:
        return []
    recorded: dict[int, Counter] = {}
    if spark is not None:
        feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", first)
                .option("endingVersion", latest).load(path))
        names = [c for c in feed.columns if not c.startswith("_")]
        for row in feed.collect():
            counter = recorded.setdefault(row["_commit_version"], Counter())
            counter[tuple(_normalize(row[n]) for n in names)] += 1 if row["_change_type"] in INSERTED else -1
    else:
        data = pa.table(DeltaTable(path).load_cdf(starting_version=first, ending_version=latest).read_all())
        names = [n for n in data.column_names if not n.startswith("_")]
        for row in data.to_pylist():
            counter = recorded.setdefault(row["_commit_version"], Counter())
            counter[tuple(_normalize(row[n]) for n in names)] += 1 if row["_change_type"] in INSERTED else -1
    problems = []
    before = _bag(DeltaTable(path, version=first - 1).to_pyarrow_table()) if first > 0 else Counter()
    for version in range(first, latest + 1):
        after = _bag(DeltaTable(path, version=version).to_pyarrow_table())
        expected = Counter(after)
        expected.subtract(before)
        got = recorded.get(version, Counter())
        if +expected != +got or -expected != -got:
            problems.append(f"{path} version {version}: versions differ by {dict(+expected)} / -{dict(-expected)}, "
                            f"the feed records {dict(+got)} / -{dict(-got)}")
        before = after
    return problems


SUMMARIES: list[str] = []  # figures tests want shown after the run (see conftest.pytest_terminal_summary)


def rewrites_after_appends(path: str) -> list[int]:
    """Versions of the Delta table at `path` that replaced its contents after appends to it: a
    state table's compactions, an arrangement's rebuilds (keyed/upkeep.py)."""
    from deltalake import DeltaTable

    found, appended = [], False
    for commit in sorted(DeltaTable(path).history(), key=lambda commit: commit["version"]):
        mode = str((commit.get("operationParameters") or {}).get("mode", "")).lower()
        if mode == "append":
            appended = True
        elif mode == "overwrite" and appended:
            found.append(commit["version"])
            appended = False
    return found


def upkeep_done(root: str) -> tuple[int, int]:
    """How many state compactions and arrangement rebuilds the warehouse at `root` holds."""
    states = glob.glob(f"{root}/_epochal/tables/*/state/*/_delta_log")
    arrangements = glob.glob(f"{root}/_epochal/arrangements/*/_delta_log")
    return (sum(len(rewrites_after_appends(p.removesuffix("/_delta_log"))) for p in states),
            sum(len(rewrites_after_appends(p.removesuffix("/_delta_log"))) for p in arrangements))
