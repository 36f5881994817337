"""Arrangements (epochal/arrangements.py): a join partner kept sorted by its key and read for a
change batch's keys, plus the partner's change feed since. Exactness is the differential test's
(tests/test_shared_reads.py: every table equals its recompute after every epoch, with every keyed
input arranged); here, that arrangements are made and served, and the Z-set arithmetic against a
reference in Python."""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import shutil
import struct
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal import Engine
from epochal.graph import WEIGHT
from epochal.keyed.arrangements import (
    ROW_GROUP,
    ArrangementCommit,
    Arrangements,
    TooManyRows,
    due_for_rebuild,
    net_rows,
    what_was_done,
)
from epochal.keyed.keyed_files import KeyedFiles
from epochal.keyed.local_copies import LocalCopies
from epochal.keyed.upkeep import Upkeep
from epochal.planning.optimize.restrict_cogenerators import keyed_partners
from tests.support import SyntheticSource, assert_matches_recompute
from tests.test_differential import SLOW, epoch_lists, run_epochs
from tests.test_shared_reads import DRIVER_ROWS, RESTRICTED

FLOATS = st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf"), None])
ROWS = st.lists(st.tuples(st.sampled_from([1, 2, None]), FLOATS, st.integers(-2, 2)), max_size=12)


def _identity(value):
    """A value as the arrangement tells rows apart: a float by its bits."""
    return struct.pack("<d", value) if isinstance(value, float) else value


@pytest.mark.parametrize("key", [None, "k"])
@settings(max_examples=200, deadline=None)
@given(rows=ROWS)
def test_net_rows_repeats_each_stored_row_its_summed_weight(rows, key):
    table = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                      "x": pa.array([r[1] for r in rows], pa.float64()),
                      WEIGHT: pa.array([r[2] for r in rows], pa.int64())})
    totals = Counter()
    for k, x, weight in rows:
        totals[(k, _identity(x))] += weight
    result = net_rows(table, key)
    if any(total < 0 for total in totals.values()):
        assert result is None
        return
    assert result is not None and result.column_names == ["k", "x"]
    found = Counter((k, _identity(x)) for k, x in zip(result.column("k").to_pylist(), result.column("x").to_pylist()))
    assert found == +totals
    assert all(not (isinstance(x, float) and math.isnan(x)) or _identity(x) == _identity(float("nan"))
               for x in result.column("x").to_pylist())


class _Served(logging.Handler):
    """Counts the keyed reads the arrangements served."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.served = 0
        self.copies_unread = 0

    def emit(self, record):
        if "from its arrangement" in record.getMessage() and "too many" not in record.getMessage():
            self.served += 1
        if "local cop" in record.getMessage() and record.levelno >= logging.WARNING:
            self.copies_unread += 1


@contextlib.contextmanager
def _listening(handler: logging.Handler):
    """`handler` receives the engine's log records, its debug records too, inside the block."""
    logger = logging.getLogger("epochal")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run_counting_served(spark, warehouse, shapes, epochs) -> tuple[str, int]:
    """run_epochs with every input read by key arranged: (its warehouse root, the keyed reads
    served by arrangements), every arrangement file read from its local copy."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    with _listening(_Served()) as handler:
        reports = run_epochs(spark, warehouse, shapes, epochs, driver_rows=DRIVER_ROWS, arrange_rows=0, root=root)
    outcomes = [report.detail.get("arrangements") for report in reports]  # no silent fallback: in every report
    assert all(outcome is not None and not outcome["failed"] for outcome in outcomes), outcomes
    assert any(outcome["arranged"].get("built") for outcome in outcomes), outcomes
    assert handler.copies_unread == 0
    assert handler.served == 0 or glob.glob(f"{root}/_epochal/local_copies/*/*.arrow")
    return root, handler.served


def test_arrangements_are_built_appended_and_read(spark, warehouse):
    """A key changed on each side over four epochs: the inputs read by key are arranged, the
    arrangements advance by appends of the change feed, later reads are served from them, the
    tables stay exact, and `explain` shows each arrangement's state and size."""
    epochs = [([("delete_key", 4)], [("rename", 1, "uno")]), ([("move_key", "y", 1)], []),
              ([("delete_key", 2)], [("rename", 2, "dos")]), ([], [("rename", 1, "eins")])]
    shapes = {name: RESTRICTED[name] for name in ("joined", "with_partner", "exists_over_join")}
    root, served = _run_counting_served(spark, warehouse, shapes, epochs)
    arrangements = Arrangements(f"{root}/_epochal/arrangements", warehouse=root)
    chains = {(source, key): arrangements.chain(f"{root}/sources/{source}", key)
              for source in ("a", "b") for key in ("k",)}
    assert all(chains.values()), chains
    assert any(len(chain) > 1 and chain[-1].since is not None for chain in chains.values()), chains  # appended
    assert served > 0
    engine = Engine(spark, root, arrange_rows=0)
    engine.source("a")
    engine.source("b")
    engine.define_all(shapes)
    explained = engine.explain("joined")
    assert all(f"{name} by k: as of version" in explained for name in ("a", "b")), explained
    assert "read by key in incremental steps: a.k, b.k" in explained, explained


@pytest.mark.long  # a further arranged run; make test-long
def test_the_first_epoch_arranges_what_the_incremental_steps_read(spark, warehouse):
    """Tables computed in full (the first epoch) arrange the inputs their plans' join terms and
    subqueries read by key, at the versions computed, so the first incremental epoch is served
    from arrangements (appended, not built), and stays exact."""
    shapes = {name: RESTRICTED[name] for name in ("joined", "exists_over_join")}
    root, served = _run_counting_served(spark, warehouse, shapes, [([("delete_key", 4)], [("rename", 1, "uno")])])
    engine = Engine(spark, root, arrange_rows=0)
    engine.source("a")
    engine.source("b")
    engine.define_all(shapes)
    assert keyed_partners(engine.table("joined").compiled.plan) == {("a", "k"), ("b", "k")}
    arrangements = Arrangements(f"{root}/_epochal/arrangements", warehouse=root)
    for source in ("a", "b"):
        chain = arrangements.chain(f"{root}/sources/{source}", "k")
        assert chain and chain[0].since is None and chain[-1].since is not None, (source, chain)  # built, then appended
    assert served > 0


@pytest.mark.parametrize("builder", ["spark", "driver"])
def test_a_build_sorts_the_input_by_its_key_into_disjoint_ranges(spark, warehouse, builder):
    """Built by Spark (in files of few rows) or on the driver, an arrangement holds exactly its
    input's rows (NULL keys too), in row groups of at most ROW_GROUP rows, each row group and
    each file one range of keys, the ranges disjoint and in order: the layout a keyed read skips
    files and row groups by. Reads of overlapping keys (row groups decoded once, then kept) find
    every row of their keys, as do reads from local copies, and from Parquet where no copy can be
    made."""
    import random

    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    random.seed(7)
    source = f"{warehouse}/{uuid.uuid4().hex[:8]}/sources/a"
    rows = [(random.choice([None, *range(-500, 500)]), f"v{i % 7}") for i in range(5_000)]
    for part in range(3):  # three files spanning all keys, as random keys' inserts leave a table
        write_deltalake(source, pa.table({"k": pa.array([r[0] for r in rows[part::3]], pa.int32()),
                                          "v": pa.array([r[1] for r in rows[part::3]], pa.string())}), mode="append")
    arrangements = Arrangements(f"{warehouse}/{uuid.uuid4().hex[:8]}", rows_per_file=1_500,
                                driver_build_rows=0 if builder == "spark" else 10_000)
    commit = arrangements.build(spark, source, 2, "k", ["k", "v"])
    arranged = DeltaTable(arrangements.path(source, "k"), version=commit.version)
    data = arranged.to_pyarrow_table()
    assert Counter(zip(data.column("k").to_pylist(), data.column("v").to_pylist())) == Counter(rows)
    assert set(data.column(WEIGHT).to_pylist()) == {1} and commit.rows == len(rows)
    files = arranged.file_uris()
    if builder == "spark":
        assert len(files) >= 3, files  # about 5,000 / 1,500 ranges, each a file
    spans = []
    for file in files:
        metadata = pq.ParquetFile(file).metadata
        for group in range(metadata.num_row_groups):
            chunk = metadata.row_group(group).column(0)
            assert metadata.row_group(group).num_rows <= ROW_GROUP
            if chunk.statistics.has_min_max:
                spans.append((chunk.statistics.min, chunk.statistics.max))
    spans.sort()
    assert all(high <= next_low for (_, high), (next_low, _) in zip(spans, spans[1:])), spans  # a key may straddle two
    blocked = f"{warehouse}/{uuid.uuid4().hex[:8]}-not-a-folder"
    open(blocked, "w").close()
    readers = {"Parquet": arrangements,  # and, where copies cannot be made, Parquet cut by row group on its own
               "copies failing": Arrangements(arrangements.root, files=KeyedFiles(copies=LocalCopies(f"{blocked}/copies"))),
               "copies": Arrangements(arrangements.root, files=KeyedFiles(copies=LocalCopies(f"{warehouse}/{uuid.uuid4().hex[:8]}")))}
    for name, reader in readers.items():
        for keys in ([-500, 0, 499], [-3, 0, 7, 250], [0, 7], list(range(-20, 20))):  # row groups decoded again, and not
            found = reader.read(source, 2, "k", pa.array(keys, pa.int32()), keys == [0, 7], ["k", "v"], None)
            wanted = [r for r in rows if r[0] in keys or (keys == [0, 7] and r[0] is None)]
            assert Counter(zip(found.column("k").to_pylist(), found.column("v").to_pylist())) == Counter(wanted), \
                (name, keys)
        every = pa.array(range(-500, 500), pa.int32())  # more rows than a limit below them: refused
        with pytest.raises(TooManyRows):
            reader.read(source, 2, "k", every, False, ["k", "v"], None, len(rows) // 2)
        nulls_only = reader.read(source, 2, "k", pa.array([], pa.int32()), True, ["k", "v"], None)
        assert nulls_only.column("k").null_count == nulls_only.num_rows == sum(r[0] is None for r in rows), name
        assert reader.read(source, 2, "k", every, False, ["k", "v"], None, len(rows)).num_rows \
            == sum(r[0] is not None for r in rows), name
        served = reader.take_served()[(source, "k")]
        assert (served["copied_files"] > 0) == (name == "copies"), (name, served)
        assert (served["row_groups"] > 0) == (name != "copies"), (name, served)


def test_an_arrangement_is_built_again_once_its_appends_are_many_or_large():
    def chain(built, *appended):
        return [ArrangementCommit(0, None, 0, ("k",), built)] + [ArrangementCommit(i + 1, i, i + 1, ("k",), rows)
                                                       for i, rows in enumerate(appended)]

    assert not due_for_rebuild(chain(10))
    assert not due_for_rebuild(chain(10, *[1_000] * 50))  # few rows in all: a read decodes them in ms
    assert due_for_rebuild(chain(10, *[1] * Upkeep().rebuild_appends))  # as many files as a read should open
    assert not due_for_rebuild(chain(60_000_000, *[60_000] * 30))  # 1.8M rows: 3% of what was built
    assert due_for_rebuild(chain(60_000_000, *[600_000] * 11))  # 6.6M rows: 11%
    assert due_for_rebuild(chain(None, *[1] * 8)) and not due_for_rebuild(chain(None, *[1] * 7))  # unrecorded rows
    eager = Upkeep(rebuild_appends=3, rebuild_fraction=0.5, rebuild_rows=0)  # as tests set it through the Engine
    assert due_for_rebuild(chain(100, 1, 1, 1), eager) and not due_for_rebuild(chain(100, 1, 1), eager)
    assert due_for_rebuild(chain(100, 51), eager) and not due_for_rebuild(chain(100, 50), eager)


def test_an_arrangement_of_a_table_deleted_and_created_again_is_not_read(spark, warehouse):
    """Each commit of an arrangement records the Delta table id of its input. Once another table
    stands at the input's path (deleted and created again, its versions counting from 0 again), the
    arrangement is neither read nor appended to, whatever the versions say, and the next advance
    builds it from the new table. (The ledger's ids catch this first in a refresh, and drop the
    path's arrangements: tests/test_table_identity.py; this is the arrangement's own guard.)"""
    source = f"{warehouse}/{uuid.uuid4().hex[:8]}/t"
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])

    def created(rows, commits):
        write_deltalake(source, pa.Table.from_pylist(rows[:1], schema), mode="overwrite")
        for row in rows[1:commits]:
            write_deltalake(source, pa.Table.from_pylist([row], schema), mode="append")
        return DeltaTable(source).metadata().id

    def feed(before, after):
        return None  # a read at the built version needs none; an append would read it

    old_id = created([{"k": k, "v": "old"} for k in range(4)], 4)
    arrangements = Arrangements(f"{warehouse}/{uuid.uuid4().hex[:8]}/arrangements", min_rows=0)
    built = arrangements.build(spark, source, 3, "k", ["k", "v"])
    assert built.source_id == old_id
    keys = pa.array([1, 2], pa.int64())
    assert arrangements.read(source, 3, "k", keys, False, ["k", "v"], feed).column("v").to_pylist() == ["old"] * 2

    shutil.rmtree(source)
    new_id = created([{"k": k, "v": "new"} for k in range(6)], 6)  # versions 0 to 5: version 3 exists again
    arrangements.begin_refresh()
    assert arrangements.chain(source, "k") == []
    assert arrangements.read(source, 3, "k", keys, False, ["k", "v"], feed) is None
    assert arrangements.advance(spark, source, 5, "k", ["k", "v"], feed) == "built: none yet"
    assert arrangements.chain(source, "k")[-1].source_id == new_id
    assert arrangements.read(source, 5, "k", keys, False, ["k", "v"], feed).column("v").to_pylist() == ["new"] * 2


def test_the_readers_of_a_replaced_source_forget_its_arrangements_at_once_without_failing(spark, warehouse):
    """The tables of one wave refresh in threads, and each that reads a replaced source forgets
    that source's arrangements: the folders are deleted once, and no reader fails on a folder
    another has just deleted."""
    source = f"{warehouse}/{uuid.uuid4().hex[:8]}/t"
    schema = pa.schema([("k", pa.int64()), ("j", pa.int64())])
    write_deltalake(source, pa.Table.from_pylist([{"k": k, "j": -k} for k in range(8)], schema))
    arrangements = Arrangements(f"{warehouse}/{uuid.uuid4().hex[:8]}/arrangements", min_rows=0)
    for key in ("k", "j"):
        arrangements.build(spark, source, 0, key, ["k", "j"])
    with ThreadPoolExecutor(4) as pool:
        dropped = list(pool.map(lambda _: arrangements.forget(source), range(4)))
    assert sum(dropped) == 2, dropped
    assert arrangements.of(source) == []


def test_a_failed_arrangement_is_reported_with_its_refreshes_in_a_row_and_the_tables_stay_exact(spark, warehouse):
    """An arrangement that cannot be written (here a file stands where its folder goes) fails the
    refresh of nothing: its readers read the input itself, and each refresh's report says which
    arrangement failed, why, and how many refreshes in a row it has; once it can be written it is
    built, and the count starts again."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", "k int, v int", [(i, i) for i in range(30)])
    b = SyntheticSource(spark, f"{root}/sources/b", "k int, name string", [(i, f"n{i % 4}") for i in range(0, 30, 2)])
    engine = Engine(spark, root, cost_model=False, arrange_rows=0, driver_rows=DRIVER_ROWS)  # read by key
    engine.source("a")
    engine.source("b")
    engine.define_all({"joined": "SELECT a.k, a.v, b.name FROM a JOIN b ON a.k = b.k"})
    blocked = Path(engine.arrangements.path(a.path, "k"))
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not an arrangement")

    for attempt, change in enumerate([None, "k = 4", "k = 6"], start=1):
        if change:
            b.delete(change)  # the step reads a by key for b's changed keys
        outcome = engine.refresh()[0].detail["arrangements"]
        failed = [f for f in outcome["failed"] if f.startswith(f"{a.path} by k")]
        in_a_row = "once" if attempt == 1 else f"{attempt} times"
        assert len(failed) == 1 and failed[0].endswith(f"({in_a_row} in a row)"), outcome
        assert_matches_recompute(engine)

    blocked.unlink()
    b.insert([(8, "n9"), (100, "n1")])
    outcome = engine.refresh()[0].detail["arrangements"]
    assert outcome["failed"] == [] and outcome["arranged"].get("built"), outcome
    assert engine.arrangement_failures == {}
    assert_matches_recompute(engine)


def test_tables_refreshed_one_at_a_time_share_one_arrangement_built_once(spark, warehouse):
    """Two tables read `a` by key for different columns, each refreshed alone (as a Dagster asset
    refreshes its own table): the arrangement is built once, with the columns both read, and then
    appended to; neither table's refresh builds it again for a column the other did not read."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", "k int, v int, w string", [(i, i, f"w{i}") for i in range(30)])
    b = SyntheticSource(spark, f"{root}/sources/b", "k int, name string", [(i, f"n{i % 4}") for i in range(0, 30, 2)])
    engine = Engine(spark, root, cost_model=False, arrange_rows=0, driver_rows=DRIVER_ROWS)
    engine.source("a")
    engine.source("b")
    engine.define_all({"with_v": "SELECT a.k, a.v, b.name FROM a JOIN b ON a.k = b.k",
                       "with_w": "SELECT a.k, a.w, b.name FROM a JOIN b ON a.k = b.k"})
    done = []
    for change in (None, "k = 4", "k = 6", "k = 8"):
        if change:
            a.insert([(int(change[-1]) + 100, 1, "new")])  # a moves on: its arrangement is appended to
            b.delete(change)  # each step reads a by key for b's changed keys
        for table in ("with_v", "with_w"):
            engine.refresh([table])
            done += [what_was_done(what) for path, key, _, what, _ in engine.arranged if path == a.path and key == "k"]
        assert_matches_recompute(engine)
    assert done.count("built") == 1 and "appended" in done, done
    chain = engine.arrangements.chain(a.path, "k")
    assert {"k", "v", "w"} <= {c.lower() for c in chain[-1].columns}, chain


def test_a_warehouse_copied_elsewhere_keeps_its_arrangements_and_their_local_copies(spark, warehouse):
    """Arrangements and local copies are named by their inputs' paths within the warehouse: a
    warehouse copied (or moved) to another folder reads them there, builds none again, makes no
    copy again, and stays exact."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    schemas = {"a": "k int, v int", "b": "k int, name string"}

    def started(at, rows=None):
        sources = {name: SyntheticSource(spark, f"{at}/sources/{name}", schema, rows[name]) if rows
                   else SyntheticSource.at(spark, f"{at}/sources/{name}", schema) for name, schema in schemas.items()}
        engine = Engine(spark, at, cost_model=False, arrange_rows=0, driver_rows=DRIVER_ROWS)
        for name in schemas:
            engine.source(name)
        engine.define_all({"joined": "SELECT a.k, a.v, b.name FROM a JOIN b ON a.k = b.k"})
        return engine, sources

    engine, sources = started(root, {"a": [(i, i) for i in range(30)], "b": [(i, f"n{i % 4}") for i in range(0, 30, 2)]})
    done, made = [], 0
    for change in (None, "k = 4", "k = 8"):
        if change:
            sources["b"].delete(change)
        made += engine.refresh()[0].detail["arrangements"]["copies"].get("made", 0)
        done += [what_was_done(what) for path, _, _, what, _ in engine.arranged if path == sources["a"].path]
    assert "built" in done and made, (done, made)

    copied = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    shutil.copytree(root, copied)
    engine, sources = started(copied)
    sources["b"].delete("k = 6")
    sources["a"].insert([(106, 1)])
    report = engine.refresh()[0]
    assert_matches_recompute(engine)
    done = [what_was_done(what) for path, _, _, what, _ in engine.arranged if path == sources["a"].path]
    assert done and "built" not in done, engine.arranged
    assert report.detail["arrangements"]["copies"].get("made", 0) == 0, report.detail["arrangements"]


def test_vacuum_deletes_a_rebuilt_arrangements_old_files_and_it_stays_in_use(spark, warehouse):
    """The vacuum job's arrangements: a rebuild leaves the last build's files behind, VACUUM
    deletes them, and the arrangement's chain (which VACUUM's own commits do not break) still
    serves reads. The rebuild also deletes the local copy of the last build's file."""
    from deltalake import write_deltalake

    from epochal import maintenance
    from epochal.storage.warehouse import Warehouse

    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    source = f"{root}/sources/a"
    write_deltalake(source, pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
    write_deltalake(source, pa.table({"k": pa.array([4], pa.int64()), "v": ["d"]}), mode="append")
    copies = LocalCopies(Warehouse(root).local_folder("local_copies"), warehouse=Warehouse(root).root)
    arrangements = Arrangements(Warehouse(root).engine_path("arrangements"), files=KeyedFiles(copies=copies),
                                warehouse=Warehouse(root).root)
    arrangements.build(spark, source, 0, "k", ["k", "v"])
    first = glob.glob(f"{copies.directory}/*/*.arrow")
    arrangements.build(spark, source, 1, "k", ["k", "v"])  # built again: version 0's file is removed
    second = glob.glob(f"{copies.directory}/*/*.arrow")
    assert len(first) == len(second) == 1 and first != second
    [target] = maintenance.targets(root, arrangements=True, spark=spark)
    assert target.kind == "arrangement" and target.label.startswith("(arrangements)/a.k.")
    result = maintenance.vacuum(spark, target, 0, allow_short_retention=True)
    assert result.detail["files_deleted"] == 1, result.message
    assert [(c.since, c.to) for c in Arrangements(arrangements.root, warehouse=arrangements.warehouse).chain(source, "k")] == [(None, 1)]
    rows = arrangements.read(source, 1, "k", pa.array([2, 4], pa.int64()), False, ["k", "v"], lambda *_: None)
    assert sorted(rows.to_pylist(), key=lambda r: r["k"]) == [{"k": 2, "v": "b"}, {"k": 4, "v": "d"}]
    assert arrangements.take_served()[(source, "k")]["copied_files"] == 1


KEYED_STATE = {  # state keyed by an integer first: the aggregate's groups, the distinct rows, the use counts
    "per_key": "SELECT k, count(*) AS n, sum(v) AS s, count(DISTINCT g) AS groups FROM a GROUP BY k",
    "distinct_pairs": "SELECT DISTINCT k, g FROM a",
}


class _StateReads(logging.Handler):
    """Counts the state files keyed reads took from local copies, and keeps warnings about copies."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.copied_files = 0
        self.warnings = []

    def emit(self, record):
        message = record.getMessage()
        if "/state/" in message and message.endswith("from local copies"):
            self.copied_files += int(message.rsplit(":", 1)[1].split()[0])
        if record.levelno >= logging.WARNING and "local cop" in message:
            self.warnings.append(message)


@pytest.mark.long  # a second differential run of the arranged path; make test-long
@SLOW
@given(epochs=epoch_lists(min_size=1, max_size=2))
def test_state_too_large_for_the_driver_is_kept_in_key_order_and_read_from_local_copies(spark, warehouse, epochs):
    """State tables too large for the driver (DRIVER_ROWS) are written by Spark in key order and
    copied when written; incremental steps read their changed keys' rows (NULL keys too) from the
    copies, and every table equals its recompute after every epoch."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    # and one row at a known key, then at NULL: changes of at most DRIVER_ROWS rows are the driver's to apply
    known = [([("insert", [(1, "w", 2, Decimal("0.50"))])], []), ([("insert", [(None, "w", 1, None)])], [])]
    with _listening(_StateReads()) as handler:
        run_epochs(spark, warehouse, KEYED_STATE, [*epochs, *known], driver_rows=DRIVER_ROWS, arrange_rows=0,
                   root=root)
    assert not handler.warnings, handler.warnings
    assert handler.copied_files > 0
    copies = LocalCopies(f"{root}/_epochal/local_copies", warehouse=root)
    states = glob.glob(f"{root}/_epochal/tables/*/state/*/")
    assert len(states) == 3, states  # per_key's groups and its distinct g's use counts; distinct_pairs' rows
    for state in states:
        for uri in DeltaTable(state.rstrip("/"), version=0).file_uris():  # the first epoch's, by Spark
            keys = pq.read_table(uri).column(0).to_pylist()  # the first key (a's k, renamed)
            assert keys == sorted(keys, key=lambda k: (k is not None, k)), (state, keys)  # Spark sorts NULLs first
        assert glob.glob(f"{copies._folder(state.rstrip('/'))}/*.arrow"), state


def test_a_change_feed_the_driver_does_not_hold_is_appended_through_spark(spark, warehouse):
    """An input's changes too many for the driver to hold (a large update of a column no table
    reads, say) are appended as Spark reads the change feed, not by building the arrangement
    again; a feed large enough to be due for a rebuild builds it. Either way a read of every
    key returns the input's rows."""
    source = f"{warehouse}/{uuid.uuid4().hex[:8]}/t"
    (spark.range(0, 500).selectExpr("id AS k", "CAST(id % 7 AS STRING) AS v").write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(source))
    spark.sql(f"UPDATE delta.`{source}` SET v = concat(v, '.') WHERE k % 3 = 0")
    spark.sql(f"DELETE FROM delta.`{source}` WHERE k % 5 = 1")
    spark.range(1000, 1010).selectExpr("id AS k", "'new' AS v").write.format("delta").mode("append").save(source)

    def not_held(before, after):
        return None

    def rows_of(table) -> list:
        return sorted(zip(table.column("k").to_pylist(), table.column("v").to_pylist()))

    keys = pa.array(list(range(0, 500)) + list(range(1000, 1010)), pa.int64())
    expected = sorted((r.k, r.v) for r in spark.read.format("delta").load(source).collect())
    for upkeep, done in ((Upkeep(), "appended: through Spark, 444 rows"),
                         (Upkeep(rebuild_fraction=0.1, rebuild_rows=0), "built: due for a rebuild with the change feed's 444 rows")):
        arrangements = Arrangements(f"{warehouse}/{uuid.uuid4().hex[:8]}/arrangements", min_rows=0, upkeep=upkeep)
        arrangements.build(spark, source, 0, "k", ["k", "v"])
        assert arrangements.advance(spark, source, 3, "k", ["k", "v"], not_held) == done
        chain = arrangements.chain(source, "k")
        if what_was_done(done) == "appended":
            assert (chain[-1].since, chain[-1].to, chain[-1].rows) == (0, 3, 2 * 167 + 100 + 10)
        else:
            assert len(chain) == 1 and chain[0].to == 3
        assert rows_of(arrangements.read(source, 3, "k", keys, False, ["k", "v"], not_held)) == expected
