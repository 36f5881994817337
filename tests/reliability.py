"""What the crash, concurrency and soak tests share: a join + aggregate + DISTINCT pipeline over two
small sources with NULL keys and duplicate rows, change batches written with delta-rs (a real
Delta writer with change data feed, and no Spark job per commit), and the exactly-once checks.

    agg   a JOIN b, GROUP BY name (count, sum)       join + aggregate, state
    j     a JOIN b, every matching pair              join, a multiset with duplicate rows
    dist  SELECT DISTINCT g, name FROM j             DISTINCT over a derived table (a chain), state
    cnt   count(*), count(v), sum(v) FROM a          global aggregate: counts every row of `a`
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from epochal import Engine
from epochal.storage.clock import logical_time_metadata
from epochal.storage.deltalog import DeltaLog
from epochal.storage.ledger import COMMITTED
from tests.support import as_multiset, sql_equals, sql_literal

A_SCHEMA = pa.schema([("k", pa.int32()), ("g", pa.string()), ("v", pa.int32())])
B_SCHEMA = pa.schema([("k", pa.int32()), ("name", pa.string())])
SOURCES = ("a", "b")
PIPELINE = {
    "agg": "SELECT b.name, count(*) AS n, sum(a.v) AS s FROM a JOIN b ON a.k = b.k GROUP BY b.name",
    "j": "SELECT a.k, a.g, b.name, a.v FROM a JOIN b ON a.k = b.k",
    "dist": "SELECT DISTINCT g, name FROM j",
    "cnt": "SELECT count(*) AS n, count(v) AS nv, sum(v) AS s FROM a",
}
A_INITIAL = [(1, "x", 3), (1, "x", 3), (2, "y", None), (None, "x", 4), (3, None, 7), (4, "z", -1), (2, "y", 5)]
B_INITIAL = [(1, "one"), (2, "two"), (2, "deux"), (None, "none"), (4, None), (3, "three")]
GROUPS = (None, "x", "y", "z")
NAMES = (None, "one", "two", "deux", "three")


def source_path(root: str, name: str) -> str:
    return f"{root}/sources/{name}"


def _table(rows, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, row)) for row in rows], schema=schema)


def _stamp(at: datetime | None) -> dict:
    """Commit options stamping a logical time (tables declared with clock="logical")."""
    if at is None:
        return {}
    return {"commit_properties": CommitProperties(custom_metadata={"userMetadata": logical_time_metadata(at)})}


def append(root: str, name: str, rows, at: datetime | None = None) -> None:
    if rows:
        write_deltalake(source_path(root, name), _table(rows, A_SCHEMA if name == "a" else B_SCHEMA), mode="append",
                        **_stamp(at))


def update(root: str, name: str, column: str, value, updates: dict[str, str], at: datetime | None = None) -> None:
    """UPDATE the rows whose `column` is `value` (NULL included), as a MERGE against that one value.

    Not delta-rs's UPDATE: its change data feed pairs pre- and post-images by an anti-join, which
    is wrong for a table holding duplicate rows (1, 2, 2 -> 2, 3, 3 records pre-image 1 only and
    post-images 3, 3), and these sources hold duplicates on purpose. Its MERGE records every image.
    `updates` are SQL over the target, whose alias is `t`."""
    schema = A_SCHEMA if name == "a" else B_SCHEMA
    match = pa.Table.from_pylist([{column: value}], schema=pa.schema([schema.field(column)]))
    (
        DeltaTable(source_path(root, name))
        .merge(match, predicate=f"t.{column} IS NOT DISTINCT FROM s.{column}", source_alias="s", target_alias="t",
               **_stamp(at))
        .when_matched_update(updates=updates)
        .execute()
    )


def create_sources(root: str, a_rows=A_INITIAL, b_rows=B_INITIAL, at: datetime | None = None) -> None:
    for name, rows, schema in (("a", a_rows, A_SCHEMA), ("b", b_rows, B_SCHEMA)):
        write_deltalake(source_path(root, name), _table(rows, schema),
                        configuration={"delta.enableChangeDataFeed": "true"}, **_stamp(at))




def random_batch(root: str, rng: random.Random, commits: int = 3, at: datetime | None = None) -> int:
    """A few random commits on `a` and `b`: inserts (with duplicates and NULLs), deletes and
    updates of keys, groups and values; stamped with logical time `at` when given. Returns the
    number of commits written."""
    stamp = _stamp(at)
    a, b = source_path(root, "a"), source_path(root, "b")
    for _ in range(commits):
        kind = rng.choice(["insert_a", "insert_a", "duplicate_a", "delete_a", "update_a", "move_a",
                           "insert_b", "delete_b", "rename_b"])
        key = rng.choice([None, 0, 1, 2, 3, 4, 5])
        if kind == "insert_a":
            append(root, "a", [(rng.choice([None, 0, 1, 2, 3, 4, 5]), rng.choice(GROUPS),
                                rng.choice([None, -2, 0, 1, 5, 9])) for _ in range(rng.randint(1, 4))], at)
        elif kind == "duplicate_a":
            row = (key, rng.choice(GROUPS), rng.choice([None, 2, 6]))
            append(root, "a", [row, row], at)
        elif kind == "delete_a":
            DeltaTable(a).delete(sql_equals("k", key), **stamp)
        elif kind == "update_a":
            update(root, "a", "g", rng.choice(GROUPS), {"v": "t.v + 1"}, at)
        elif kind == "move_a":
            update(root, "a", "k", key, {"g": sql_literal(rng.choice(GROUPS))}, at)
        elif kind == "insert_b":
            append(root, "b", [(key, rng.choice(NAMES))], at)
        elif kind == "delete_b":
            DeltaTable(b).delete(sql_equals("k", key), **stamp)
        else:
            update(root, "b", "k", key, {"name": sql_literal(rng.choice(NAMES))}, at)
    return commits


def build_engine(spark, root: str, definitions=None, parallelism: int = 2, clock: str = "commit",
                 **options) -> Engine:
    engine = Engine(spark, root, parallelism=parallelism, **{"cost_model": False, **options})
    for name in SOURCES:
        engine.source(name, clock=clock)
    engine.define_all(dict(definitions or PIPELINE))
    return engine


def contents(engine, names=None) -> dict[str, Counter]:
    return {name: as_multiset(engine.read(name)) for name in (names or engine.tables())}


def state_contents(engine, names=None) -> dict[tuple[str, str], Counter]:
    """Per (table, state table), its rows as of the version the table's last committed step
    recorded: what the next epoch reads. Two runs with the same history hold the same rows (each
    row carries the seq of the step that wrote it)."""
    found = {}
    for name in names or engine.tables():
        table = engine.table(name)
        last = table.ledger.last_committed()
        for state, version in sorted((last.state_versions if last else {}).items()):
            frame = engine.spark.read.format("delta").option("versionAsOf", version).load(f"{table.state_root}/{state}")
            found[(name, state)] = as_multiset(frame)
    return found


def closed_window() -> datetime:
    """A window end just after everything written so far: with commit clocks, a closed window."""
    import time
    from datetime import timezone

    time.sleep(0.05)
    end = datetime.now(timezone.utc)
    time.sleep(0.05)
    return end


def source_version(root: str, name: str) -> int:
    return DeltaLog(source_path(root, name)).version


def exactly_once_problems(engine, names=None) -> list[str]:
    """What the ledgers and table histories say was lost or doubled:
    - a table's committed steps must cover each input's versions back to back (each step starts
      where the previous one ended), so no source commit is skipped or read twice;
    - no step may be left started (pending) after a successful refresh;
    - a step writes its derived table at most once (commits are tagged with the step's seq);
    - one epoch is committed at most once per table."""
    problems = []
    for name in names or engine.tables():
        table = engine.table(name)
        steps = table.ledger.steps()
        committed = [s for s in steps if s.status == COMMITTED]
        if table.ledger.pending() is not None:
            problems.append(f"{name}: step {table.ledger.pending().seq} left started")
        for before, after in zip(committed, committed[1:]):
            for source, versions in after.inputs.items():
                previous = before.inputs.get(source, {}).get("to", -1)
                if versions["from"] != previous:
                    problems.append(f"{name}: step {after.seq} reads {source} from version {versions['from']}, "
                                    f"but step {before.seq} ended at {previous}")
        epochs = Counter(s.epoch for s in committed)
        problems += [f"{name}: epoch {e} committed {n} times" for e, n in epochs.items() if n > 1]
        seqs = Counter(s.seq for s in committed)
        problems += [f"{name}: step {q} committed {n} times" for q, n in seqs.items() if n > 1]
        log = DeltaLog.open(table.path, engine.storage_options)
        writes: Counter = Counter()
        for commit in log.commits(0) if log is not None else []:
            try:
                tag = json.loads(commit.user_metadata or "{}").get("epochal", {})
            except (ValueError, AttributeError):
                continue
            if tag.get("table") == name:
                writes[(tag.get("seq"), tag.get("write"))] += 1
        problems += [f"{name}: step {seq} wrote its {what} {n} times" for (seq, what), n in writes.items() if n > 1]
    return problems
