"""Shared test helpers: multiset comparison of a derived table with its full recompute, and
writing real Delta commits (inserts, deletes, updates) to synthetic source tables."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal

from delta.tables import DeltaTable

RELATIVE_TOLERANCE = 1e-9  # DOUBLE sums drift under add and subtract; DECIMAL must match exactly


def _normalize(value):
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return value
        return float(f"{value:.9g}")  # relative tolerance of ~1e-9
    if isinstance(value, Decimal):
        return value
    return value


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


def assert_matches_recompute(engine, names=None, context: str = "") -> None:
    problems = [p for p in (multiset_diff(engine, n) for n in (names or engine.tables())) if p]
    assert not problems, (context + "\n" if context else "") + "\n".join(problems)


class SyntheticSource:
    """A small source Delta table with change data feed, changed by real Delta commits."""

    def __init__(self, spark, path: str, schema: str, rows: list[tuple]):
        self.spark, self.path, self.schema = spark, path, schema
        (
            spark.createDataFrame(rows, schema)
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .save(path)
        )

    def insert(self, rows: list[tuple]) -> None:
        if rows:
            self.spark.createDataFrame(rows, self.schema).write.format("delta").mode("append").save(self.path)

    def delete(self, condition: str) -> None:
        DeltaTable.forPath(self.spark, self.path).delete(condition)

    def update(self, condition: str, assignments: dict[str, str]) -> None:
        DeltaTable.forPath(self.spark, self.path).update(condition, assignments)

    def rows(self) -> list[tuple]:
        return [tuple(row) for row in self.spark.read.format("delta").load(self.path).collect()]


SUMMARIES: list[str] = []  # figures tests want shown after the run (see conftest.pytest_terminal_summary)
