"""Local copies (epochal/keyed/local_copies.py): an arrangement file's rows read from its Arrow IPC
copy by key bounds per block of rows. Exactness against pyarrow's own filter of the Parquet file, for integer
and date keys with NULLs; a damaged copy is dropped and read as Parquet; the disk budget and the
free disk hold; a failed copy is tried again later; every fallback is counted.
The copies also serve every arrangement read of the differential tests (tests/test_shared_reads.py,
tests/test_arrangements.py), whose Engine makes them under the warehouse."""

from __future__ import annotations

import datetime
import decimal
import mmap
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.keyed.file_pruning import as_integers, certain_rows_in_row_groups, expected_rows_in_row_groups
from epochal.keyed.local_copies import (DENSE_ROWS, PROTECTED_REFRESHES, LocalCopies, MappedCopy, absent_pages, dense,
                                        making_seconds)

KEYS = st.lists(st.one_of(st.none(), st.integers(-40, 40)), min_size=1, max_size=300)


def _file(folder, keys: list, date: bool, ordered: bool = True):
    """A Parquet file of `keys` (sorted, as an arrangement's, or as drawn), in row groups of 16
    rows, and its fragment."""
    if ordered:
        keys = sorted(keys, key=lambda k: (k is None, k))
    column = pa.array(keys, pa.int64())
    if date:
        column = pa.array([None if k is None else datetime.date(2000, 1, 1) + datetime.timedelta(days=k)
                           for k in keys], pa.date32())
    table = pa.table({"K": column, "v": pa.array(range(len(keys)), pa.int64()),
                      "s": pa.array([f"row {i}" for i in range(len(keys))])})
    path = os.path.join(folder, "part-0.parquet")
    pq.write_table(table, path, row_group_size=16)
    return path, next(iter(ds.dataset(path, format="parquet").get_fragments())), table


def _files(folder, count: int) -> list:
    """`count` files of keys 0 to 1,999, each in a folder of its own under `folder` (a table each)."""
    made = []
    for index in range(count):
        (folder / f"file{index}").mkdir()
        made.append(_file(str(folder / f"file{index}"), list(range(2_000)), date=False))
    return made


def _read(copies, path, fragment, table, wanted: list, nulls: bool):
    values = pa.array(wanted, table.schema.field("K").type)
    rows = copies.rows(path, fragment, "k", np.sort(as_integers(values)), nulls, ["v", "K", "s"])
    assert rows is not None
    mask = pc.is_in(rows.column("K"), value_set=values)
    if nulls:
        mask = pc.or_(mask, pc.is_null(rows.column("K")))
    kept = rows.filter(pc.fill_null(mask, False))
    assert kept.num_rows == rows.num_rows, "a copy returns the rows of its keys only"
    return sorted(kept.column("v").to_pylist())


@pytest.mark.parametrize("date", [False, True])
@settings(max_examples=60, deadline=None)
@given(keys=KEYS, wanted=st.lists(st.integers(-45, 45), max_size=20), nulls=st.booleans(),
       batch_rows=st.sampled_from([1, 3, 16, 40, 256]), ordered=st.booleans(),
       copy_batch_rows=st.sampled_from([1, 16, 50, 1 << 20]))
def test_a_copy_serves_exactly_the_rows_of_its_keys(tmp_path_factory, keys, wanted, nulls, batch_rows, ordered, date,
                                                    copy_batch_rows):
    """Whatever its blocks of bounds and its record batches (row groups of 16 rows joined up to
    `copy_batch_rows`); and the rows its bounds show to hold the keys (`certain_rows`) are never
    more than do."""
    folder = str(tmp_path_factory.mktemp("copies"))
    path, fragment, table = _file(folder, keys, date, ordered)
    if date:
        wanted = [datetime.date(2000, 1, 1) + datetime.timedelta(days=k) for k in wanted]
    copies = LocalCopies(os.path.join(folder, "copies"), batch_rows=batch_rows, copy_batch_rows=copy_batch_rows)
    condition = ds.field("K").isin(pa.array(wanted, table.schema.field("K").type))
    if nulls:
        condition = condition | ds.field("K").is_null()
    expected = sorted(ds.dataset(path, format="parquet").to_table(filter=condition).column("v").to_pylist())
    assert _read(copies, path, fragment, table, wanted, nulls) == expected
    assert _read(LocalCopies(copies.directory, batch_rows=batch_rows), path, fragment, table, wanted, nulls) \
        == expected  # a second process reads the copy the first made
    values = pa.array(wanted, table.schema.field("K").type)
    holding = ds.dataset(path, format="parquet").to_table(filter=ds.field("K").isin(values)).num_rows
    integers = np.sort(as_integers(values))
    certain = copies.certain_rows(path, "k", integers)
    from_statistics = certain_rows_in_row_groups(fragment, "K", integers)
    assert certain <= holding and from_statistics <= holding  # lower bounds: a read is refused only when
    # it surely holds more rows


def test_rows_are_certain_where_a_batch_holds_one_wanted_key_only(tmp_path):
    """From a copy's blocks, and alike from the Parquet row groups' statistics of a file with no
    copy (none is made to tell)."""
    path, fragment, _ = _file(str(tmp_path), [5] * 100 + [7] * 100 + [None] * 20, date=False)
    copies = LocalCopies(str(tmp_path / "copies"), batch_rows=16)
    assert copies.certain_rows(path, "k", np.array([5], np.int64)) is None
    assert copies.existing(path, "k") is None
    copies.make(path, fragment, "k")
    # blocks and row groups of 16 rows: the seventh (rows 96-111) holds both keys, the
    # thirteenth (rows 192-207) 7 and NULL
    for keys, certain in (([5], 96), ([5, 7], 96 + 80), ([6], 0)):
        keys = np.array(keys, np.int64)
        assert copies.certain_rows(path, "k", keys) == certain
        assert certain_rows_in_row_groups(fragment, "K", keys) == certain


def test_a_reads_expected_rows_are_exact_for_shared_keys_and_near_for_dense_ones(tmp_path):
    """Told from the bounds alone, before any row is read (narrowing.outsized_reads): keys many
    rows share (a nation's customers) exactly, dense unique keys exactly, sparse ones low by their
    sparsity; a file with no copy tells nothing until one is made, and its row groups' statistics
    tell the same."""
    shared = [k for k in range(5) for _ in range(300)]
    (tmp_path / "shared").mkdir()
    path, fragment, _ = _file(str(tmp_path / "shared"), shared, date=False)
    copies = LocalCopies(str(tmp_path / "copies"), batch_rows=64)
    wanted = np.array([1, 3], np.int64)
    assert copies.expected_rows(path, "k", wanted) is None  # no copy yet, and none made for it
    assert not [f for f in (tmp_path / "copies").rglob("*") if f.is_file()]
    copies.make(path, fragment, "k")
    assert copies.expected_rows(path, "k", wanted) == pytest.approx(600, rel=0.1)
    assert expected_rows_in_row_groups(fragment, "K", wanted) == pytest.approx(600, rel=0.1)
    (tmp_path / "dense").mkdir()
    path, fragment, _ = _file(str(tmp_path / "dense"), list(range(4000)), date=False)
    copies.make(path, fragment, "k")
    wanted = np.array([7, 500, 501, 3999], np.int64)
    assert copies.expected_rows(path, "k", wanted) == pytest.approx(4)
    (tmp_path / "sparse").mkdir()
    path, fragment, _ = _file(str(tmp_path / "sparse"), list(range(0, 16000, 4)), date=False)
    copies.make(path, fragment, "k")
    assert 0 < copies.expected_rows(path, "k", np.array([8, 4000, 12000], np.int64)) <= 3
    assert copies.expected_rows(path, "k", np.array([16001], np.int64)) == 0


def test_a_damaged_copy_is_dropped_and_made_again(tmp_path, caplog):
    path, fragment, table = _file(str(tmp_path), list(range(100)), date=False)
    copies = LocalCopies(str(tmp_path / "copies"), batch_rows=8)
    target = copies.make(path, fragment, "k")
    with open(target, "r+b") as copy:
        copy.truncate(os.path.getsize(target) // 2)
    keys = np.array([3, 50, 99], dtype=np.int64)
    assert copies.rows(path, fragment, "k", keys, False, ["v"]) is None
    assert "not read" in caplog.text and not os.path.exists(target)
    again = copies.rows(path, fragment, "k", keys, False, ["v"])
    assert sorted(again.column("v").to_pylist()) == [3, 50, 99]


def test_the_seconds_making_copies_are_counted_for_the_thread_that_made_or_awaited_them(tmp_path):
    """What a step's budget leaves out (cost.budget): a thread's clock moves while it makes a copy,
    or waits on another thread making the one it needs, and not for another thread's copy or for a
    copy that exists."""
    path, fragment, _ = _file(str(tmp_path), list(range(100)), date=False)
    copies = LocalCopies(str(tmp_path / "copies"), batch_rows=8)
    made = copies._copy
    started, release = threading.Event(), threading.Event()

    def slow_copy(*args):
        started.set()
        release.wait(5)
        made(*args)

    copies._copy = slow_copy
    clocks = {}

    def make(name: str) -> None:
        before = making_seconds()
        copies.make(path, fragment, "k")
        clocks[name] = making_seconds() - before

    maker = threading.Thread(target=make, args=("maker",))
    maker.start()
    assert started.wait(5)
    waiter = threading.Thread(target=make, args=("waiter",))
    waiter.start()
    time.sleep(0.3)
    ours = making_seconds()
    release.set()
    maker.join()
    waiter.join()
    assert clocks["maker"] >= 0.3 and clocks["waiter"] >= 0.2, clocks
    assert making_seconds() == ours
    before = making_seconds()
    assert copies.make(path, fragment, "k") is not None
    assert making_seconds() == before  # an existing copy is not a copy made


def test_no_copy_is_made_that_would_leave_too_little_disk_free_and_each_fallback_is_counted(tmp_path):
    path, fragment, _ = _file(str(tmp_path), list(range(100)), date=False)
    full = LocalCopies(str(tmp_path / "copies"), batch_rows=8, min_free_bytes=1 << 62)
    assert full.make(path, fragment, "k") is None
    assert full.rows(path, fragment, "k", np.array([3], np.int64), False, ["v"]) is None  # read as Parquet
    assert full.take_counts() == {"no_room": 2} and full.take_counts() == {}
    roomy = LocalCopies(str(tmp_path / "copies"), batch_rows=8, min_free_bytes=0)
    assert roomy.make(path, fragment, "k") is not None
    assert roomy.take_counts() == {"made": 1}


def test_a_file_that_could_not_be_copied_is_copied_again_after_a_while(tmp_path):
    path, fragment, _ = _file(str(tmp_path), list(range(100)), date=False)
    os.rename(path, path + ".away")
    copies = LocalCopies(str(tmp_path / "copies"), batch_rows=8, retry_seconds=1.0)
    assert copies.make(path, fragment, "k") is None
    os.rename(path + ".away", path)
    assert copies.make(path, fragment, "k") is None  # read as Parquet for a while, not copied on every read
    time.sleep(1.1)
    assert copies.make(path, fragment, "k") is not None
    assert copies.take_counts() == {"failed": 1, "made": 1}


def test_copies_stay_within_their_disk_budget_dropping_the_least_recently_read(tmp_path):
    """And what a killed process left half written an hour ago is deleted; what one writes now is not."""
    folders = _files(tmp_path, 4)
    one = os.path.getsize(LocalCopies(str(tmp_path / "probe")).make(*folders[0][:2], "k"))
    copies = LocalCopies(str(tmp_path / "copies"), max_bytes=2 * one + one // 2)
    writing = copies._folder(os.path.dirname(folders[0][0]))
    os.makedirs(writing)
    for name, age in (("abandoned.arrow.tmp", 7_200), ("being-written.arrow.tmp", 60)):
        with open(os.path.join(writing, name), "wb") as half:
            half.write(b"\0" * 100)
        os.utime(half.name, (time.time() - age, time.time() - age))
    made = [copies.make(path, fragment, "k") for path, fragment, _ in folders[:2]]
    os.utime(made[0], (1, 1))  # read longest ago
    copies.make(*folders[2][:2], "k")
    assert not os.path.exists(made[0]) and os.path.exists(made[1])
    copies.make(*folders[3][:2], "k")
    left = [str(p) for p in (tmp_path / "copies").glob("*/*.arrow")]
    assert len(left) == 2 and sum(os.path.getsize(p) for p in left) <= copies.max_bytes
    assert copies.take_counts() == {"made": 4, "evicted": 2}
    assert [p.name for p in (tmp_path / "copies").glob("*/*.tmp")] == ["being-written.arrow.tmp"]


def test_a_new_copy_does_not_displace_those_read_in_the_latest_refreshes(tmp_path):
    """Once at their budget, copies read densely since the start of the last PROTECTED_REFRESHES
    refreshes stay: a new file's copy is not made (`over_budget`, counted once a refresh, the file
    read as Parquet), where least-recently-read eviction would drop a copy the next epoch reads
    again. A copy not read densely for that long gives way to it, and the refreshes' starts
    outlive the process that marked them."""
    folders = _files(tmp_path, 3)
    one = os.path.getsize(LocalCopies(str(tmp_path / "probe")).make(*folders[0][:2], "k"))
    metadata = folders[0][1].metadata
    expected = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))  # a new copy's
    copies = LocalCopies(str(tmp_path / "copies"), max_bytes=one + expected + one // 4)  # two fit, not three
    copies.give_way()
    made = [copies.make(path, fragment, "k") for path, fragment, _ in folders[:2]]
    copies.give_way()
    assert copies.make(*folders[2][:2], "k") is None
    assert copies.rows(*folders[2][:2], "k", np.array([3], np.int64), False, ["v"]) is None  # read as Parquet
    assert all(os.path.exists(copy) for copy in made)
    assert copies.take_counts() == {"made": 2, "over_budget": 1}
    time.sleep(0.01)
    assert copies.rows(*folders[0][:2], "k", np.array([3], np.int64), False, ["v"]) is not None  # read densely
    later = LocalCopies(str(tmp_path / "copies"), max_bytes=copies.max_bytes)  # the next process
    for _ in range(PROTECTED_REFRESHES - 1):  # file 1 read densely in each of them, file 0 in none
        later.give_way()
        time.sleep(0.01)
        found = later.rows(*folders[1][:2], "k", np.array([3], np.int64), False, ["v"])
        assert found.column("v").to_pylist() == [3]
        assert later.make(*folders[2][:2], "k") is None
    assert later.take_counts() == {"over_budget": PROTECTED_REFRESHES - 1}
    later.give_way()
    assert later.make(*folders[2][:2], "k") is not None  # the copy unread for as many refreshes gives way
    assert not os.path.exists(made[0]) and os.path.exists(made[1])
    assert later.take_counts() == {"made": 1, "evicted": 1}


def test_a_sparse_read_neither_makes_nor_keeps_a_copy(tmp_path):
    """A read with fewer keys in a file's key range than one per DENSE_ROWS rows reads the copy
    there is, as it is, and else the file as Parquet: it makes no copy and does not count as the
    copy's read. A copy made ahead of its reads (by an arrangement's build) that no dense read has
    used gives way to a new one after GRACE_REFRESHES refreshes; one read densely stays."""
    rows = 2 * DENSE_ROWS
    assert dense(np.array([0, rows - 1], np.int64), 0, rows - 1, rows)
    assert not dense(np.array([0], np.int64), 0, rows - 1, rows)
    assert not dense(np.array([-5, rows + 5], np.int64), 0, rows - 1, rows)  # keys outside the file's range
    files = []
    for name in ("ahead", "read", "new"):
        (tmp_path / name).mkdir()
        files.append(_file(str(tmp_path / name), list(range(rows)), date=False)[:2])
    (ahead, ahead_fragment), (read, read_fragment), (new, new_fragment) = files
    one = os.path.getsize(LocalCopies(str(tmp_path / "probe")).make(ahead, ahead_fragment, "k"))
    metadata = ahead_fragment.metadata
    expected = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))  # a new copy's
    copies = LocalCopies(str(tmp_path / "copies"), max_bytes=one + expected + one // 4)  # two fit, not three
    sparse, many = np.array([3], np.int64), np.arange(0, rows, 1_000, dtype=np.int64)
    copies.give_way()
    made = [copies.make(ahead, ahead_fragment, "k"), copies.make(read, read_fragment, "k")]
    assert copies.rows(new, new_fragment, "k", sparse, False, ["v"], dense=False) is None  # as Parquet
    assert copies.existing(new, "k") is None
    before = os.path.getmtime(made[0])
    time.sleep(0.01)
    assert copies.rows(ahead, ahead_fragment, "k", sparse, False, ["v"], dense=False).column("v").to_pylist() == [3]
    assert os.path.getmtime(made[0]) == before
    assert copies.rows(read, read_fragment, "k", many, False, ["v"], dense=True).num_rows == len(many)
    copies.give_way()
    assert copies.make(new, new_fragment, "k") is None  # both made in the latest refreshes
    copies.give_way()
    assert copies.make(new, new_fragment, "k") is not None
    assert not os.path.exists(made[0]) and os.path.exists(made[1])
    assert copies.take_counts() == {"made": 3, "over_budget": 1, "evicted": 1}


def _spanning(folder, name: str, spanned: int, rows: int = 2_000):
    """A file of `rows` rows whose keys span 0 to `spanned` - 1, in its own folder (a table),
    with its (path, fragment) and its span."""
    (folder / name).mkdir()
    path, fragment, _ = _file(str(folder / name), [i * spanned // rows for i in range(rows)], date=False)
    return path, fragment, (0, spanned - 1, rows)


def test_copies_made_ahead_of_their_reads_give_way_to_copies_of_more_worth(tmp_path):
    """A build's copies that no dense read has used yet are weighed by the keys they span a row
    (`worth`): a new copy worth more displaces them within their grace, the least worth first,
    and one worth less or as much does not; and where the free disk makes copies give way, of
    those last read in one refresh the least worth go first, not the first made."""
    sparse = _spanning(tmp_path, "by supplier", 20)  # 100 rows a key: a few keys' reads, a row group each
    dense_one, dense_two = _spanning(tmp_path, "by order", 2_000), _spanning(tmp_path, "by order too", 2_000)
    one = os.path.getsize(LocalCopies(str(tmp_path / "probe")).make(*dense_one[:2], "k", dense_one[2]))
    metadata = dense_one[1].metadata
    expected = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))  # a new copy's
    copies = LocalCopies(str(tmp_path / "copies"), max_bytes=one + expected + one // 4)  # two fit, not three
    copies.give_way()
    low, first = copies.make(*sparse[:2], "k", sparse[2]), copies.make(*dense_one[:2], "k", dense_one[2])
    assert copies.make(*dense_two[:2], "k", dense_two[2]) is not None  # worth more than the sparse one, in its grace
    assert not os.path.exists(low) and os.path.exists(first)
    assert copies.make(*sparse[:2], "k", sparse[2]) is None  # worth less than both: over budget, read as Parquet
    assert copies.take_counts() == {"made": 3, "evicted": 1, "over_budget": 1}

    roomy = LocalCopies(str(tmp_path / "roomy"))
    roomy.give_way()
    made = [roomy.make(*dense_one[:2], "k", dense_one[2]), roomy.make(*sparse[:2], "k", sparse[2])]  # sparse made last
    short = LocalCopies(str(tmp_path / "roomy"), max_bytes=one + one // 4)  # the disk fits one of them
    short.give_way()
    assert os.path.exists(made[0]) and not os.path.exists(made[1])
    assert short.take_counts() == {"evicted": 1}


def test_copies_give_way_to_the_free_disk_they_share(tmp_path):
    """The copies take at most `share_of_free` of their bytes and the free disk together, so a
    warehouse on the same disk that grows makes them give way, at the start of a refresh as well
    as when a copy is made."""
    folders = _files(tmp_path, 3)
    roomy = LocalCopies(str(tmp_path / "copies"), share_of_free=1.0)
    made = [roomy.make(path, fragment, "k") for path, fragment, _ in folders]
    roomy.give_way()
    assert all(os.path.exists(copy) for copy in made) and roomy.take_counts() == {"made": 3}
    short = LocalCopies(str(tmp_path / "copies"), share_of_free=1e-12)  # the disk as good as full
    short.give_way()
    assert not any(os.path.exists(copy) for copy in made) and short.take_counts() == {"evicted": 3}
    LocalCopies(str(tmp_path / "none yet")).give_way()  # no folder, nothing to do


def test_a_rebuilt_tables_old_copies_are_pruned_and_others_kept(tmp_path):
    table = tmp_path / "arrangement"
    table.mkdir()
    old_path, old_fragment, _ = _file(str(table), list(range(100)), date=False)
    other_path, other_fragment, _ = _file(str(tmp_path), list(range(100)), date=False)
    copies = LocalCopies(str(tmp_path / "copies"))
    old, other = copies.make(old_path, old_fragment, "k"), copies.make(other_path, other_fragment, "k")
    new_path = str(table / "part-1.parquet")
    os.replace(old_path, new_path)
    new_fragment = next(iter(ds.dataset(new_path, format="parquet").get_fragments()))
    new = copies.make(new_path, new_fragment, "k")
    assert copies.prune(str(table), [new_path], "k") == 1
    assert not os.path.exists(old) and os.path.exists(new) and os.path.exists(other)


class _Advice:
    """Records the pages a copy asks for (its `willneed`), in place of the kernel's advice."""

    def __init__(self):
        self.pages: set[int] = set()

    def willneed(self, starts, lengths):
        for start, length in zip(starts.tolist(), lengths.tolist()):
            assert start % mmap.PAGESIZE == 0 and length % mmap.PAGESIZE == 0
            self.pages |= set(range(start // mmap.PAGESIZE, (start + length) // mmap.PAGESIZE))


@pytest.fixture(scope="module")
def copy_of_every_layout(tmp_path_factory) -> str:
    """An Arrow IPC file of one 60,000-row batch: integers with NULLs, decimals, strings with
    NULLs, booleans, dates and a list."""
    count = 60_000
    table = pa.table({
        "i": pa.array([None if i % 7 == 0 else i for i in range(count)], pa.int64()),
        "d": pa.array([decimal.Decimal(i) / 100 for i in range(count)], pa.decimal128(12, 2)),
        "s": pa.array([None if i % 5 == 0 else "x" * (i % 40) for i in range(count)]),
        "b": pa.array([i % 3 == 0 for i in range(count)]),
        "t": pa.array([datetime.date(2000, 1, 1)] * count, pa.date32()),
        "l": pa.array([[i] for i in range(count)], pa.list_(pa.int64())),
    })
    path = str(tmp_path_factory.mktemp("mapped") / "copy.arrow")
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=count)
    return path


def _evicted(path: str) -> None:
    """Drop `path`'s pages from the page cache (those not mapped: Linux keeps a mapped page)."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(0, 59_996), min_size=1, max_size=40, unique=True), offset=st.integers(0, 3))
def test_a_cold_read_asks_for_the_pages_holding_its_rows_and_no_other(copy_of_every_layout, rows, offset):
    """`MappedCopy.prefetch` asks for pages holding a byte of the rows' values (validity, values,
    offsets and strings) and no other, whatever the column's type, and leaves none of them to a
    fault of its own but those in the page cache already (a page it read the offsets from); a
    layout it does not know (a list) is left to its page faults."""
    path = copy_of_every_layout
    copy = MappedCopy(path)
    assert copy.prefetching, "Linux's mmap advises"
    batch = copy.reader().get_batch(0).slice(offset)
    chosen = np.array(sorted(r for r in rows if r < batch.num_rows), np.int64)
    _evicted(path)
    advice = _Advice()
    copy.willneed = advice.willneed
    copy.prefetch(batch.columns, chosen)

    base = copy.buffer.address
    expected = set()

    def holding(buffer, first: int, last: int) -> None:
        expected.update(range((buffer.address - base + first) // mmap.PAGESIZE,
                              (buffer.address - base + max(last, first + 1) - 1) // mmap.PAGESIZE + 1))

    for column in batch.columns[:-1]:
        buffers = column.buffers()
        for row in (int(r) + column.offset for r in chosen):
            if buffers[0] is not None and column.null_count:
                holding(buffers[0], row // 8, row // 8 + 1)
            if pa.types.is_boolean(column.type):
                holding(buffers[1], row // 8, row // 8 + 1)
            elif pa.types.is_string(column.type):
                holding(buffers[1], 4 * row, 4 * row + 8)
                start, end = np.frombuffer(buffers[1], np.int32)[row:row + 2]
                holding(buffers[2], int(start), int(end))
            else:
                width = column.type.bit_width // 8
                holding(buffers[1], width * row, width * (row + 1))
    assert advice.pages and advice.pages <= expected
    left = np.array(sorted(expected - advice.pages), np.int64)
    assert not len(absent_pages(base, left)), "a page holding a row was neither asked for nor cached"


def test_a_warm_read_asks_for_nothing_and_the_page_cache_is_seen(copy_of_every_layout):
    """Pages the page cache holds are not asked for (a warm read makes no call), and mincore
    tells the held from the evicted."""
    copy = MappedCopy(copy_of_every_layout)
    batch = copy.reader().get_batch(0)
    pages = np.arange(copy.buffer.size // mmap.PAGESIZE, dtype=np.int64)
    _evicted(copy_of_every_layout)
    assert len(absent_pages(copy.buffer.address, pages)) > len(pages) // 2
    batch.take(pa.array(np.arange(batch.num_rows)))  # every page in
    assert not len(absent_pages(copy.buffer.address, pages))
    advice = _Advice()
    copy.willneed = advice.willneed
    copy.prefetch(batch.columns, np.arange(0, batch.num_rows, 97, dtype=np.int64))
    assert not advice.pages


def test_the_kernel_is_asked_for_the_pages(copy_of_every_layout):
    """The real advice reads the ranges asked for into the page cache, more of them than one
    process_madvise(2) call takes. The call returns with the reads queued, and mincore counts a
    page once its read is done: so wait."""
    copy = MappedCopy(copy_of_every_layout)
    pages = np.arange(copy.buffer.size // mmap.PAGESIZE, dtype=np.int64)
    _evicted(copy_of_every_layout)
    assert len(absent_pages(copy.buffer.address, pages)) > len(pages) // 2
    every_other = pages[::2]
    asked = np.repeat(every_other, 3)
    assert len(asked) > 1024
    copy.willneed(asked * mmap.PAGESIZE, np.full(len(asked), mmap.PAGESIZE))
    waited = 0.0
    while len(absent_pages(copy.buffer.address, every_other)) and waited < 30:
        time.sleep(0.05)
        waited += 0.05
    assert not len(absent_pages(copy.buffer.address, every_other)), "pages asked for were not read"
