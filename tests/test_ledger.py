"""The ledger's steps are parsed once and shared: what a read returns must still be every record
in order, after records written by this ledger, by another process's, and after a compaction
rewrote its files (delta-rs only)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from deltalake import DeltaTable

from epochal.storage.ledger import COMMITTED, STARTED, Ledger, Step

START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _step(seq: int, status: str) -> Step:
    end = START + timedelta(hours=seq)
    return Step(seq=seq, status=status, epoch=end.isoformat(), epoch_end=end, technique="incremental",
                inputs={"orders": {"from": seq - 1, "to": seq}}, state_versions={"agg": seq},
                detail={"phases": {"compute": 0.1 * seq}})


def _record_epoch(ledger: Ledger, seq: int) -> None:
    for status in (STARTED, COMMITTED):
        written, _ = ledger.record(_step(seq, status))
        assert written


def _keys(steps: list[Step]) -> list[tuple]:
    return [(s.seq, s.status, s.inputs, s.state_versions, s.detail) for s in steps]


def _expected(epochs: range) -> list[tuple]:
    return _keys([_step(seq, status) for seq in epochs for status in (STARTED, COMMITTED)])


def test_steps_are_parsed_once_and_still_every_record_in_order(tmp_path):
    uri = str(tmp_path / "ledger")
    ledger, elsewhere = Ledger(uri), Ledger(uri)
    for seq in (1, 2, 3):
        _record_epoch(ledger, seq)
    first = ledger.steps()
    assert _keys(first) == _expected(range(1, 4))

    _record_epoch(elsewhere, 4)  # another process's writes: new files under the same table
    _record_epoch(ledger, 5)
    after = ledger.steps()
    assert _keys(after) == _expected(range(1, 6))
    assert all(a is b for a, b in zip(first, after))  # the records read before were not parsed again
    assert _keys(elsewhere.steps()) == _expected(range(1, 6))

    DeltaTable(uri).optimize.compact()  # every record in new files: the ledger reads and parses all again
    compacted = ledger.steps()
    assert _keys(compacted) == _expected(range(1, 6))
    assert compacted[0] is not first[0]
    assert ledger.last_committed().seq == 5 and ledger.next_seq() == 6 and ledger.pending() is None


def test_a_copied_step_changes_without_changing_the_ledgers(tmp_path):
    ledger = Ledger(str(tmp_path / "ledger"))
    _record_epoch(ledger, 1)
    step = ledger.last_committed().copied()
    step.detail["estimate"] = {"rescan": 1.0}
    step.inputs["orders"] = {"from": 0, "to": 9}
    step.state_versions["agg"] = 9
    assert _keys([ledger.last_committed()]) == _keys([_step(1, COMMITTED)])


def test_a_record_is_written_once_per_key_whoever_wrote_it_first(tmp_path):
    """A record write finds the stored record of its key by the index its reads keep: records this
    ledger wrote, another process's, and the same after a compaction rewrote the files."""
    uri = str(tmp_path / "ledger")
    ledger, elsewhere = Ledger(uri), Ledger(uri)
    _record_epoch(ledger, 1)
    _record_epoch(elsewhere, 2)

    def again(writer: Ledger, seq: int, status: str) -> Step:
        retry = _step(seq, status)
        retry.detail = {"phases": {"compute": 99.0}}  # a later writer's own record, not stored
        written, stored = writer.record(retry)
        assert not written
        return stored

    assert again(ledger, 2, COMMITTED).detail == _step(2, COMMITTED).detail  # the other process's
    assert again(elsewhere, 1, STARTED).detail == _step(1, STARTED).detail
    DeltaTable(uri).optimize.compact()
    assert again(ledger, 1, COMMITTED).detail == _step(1, COMMITTED).detail
    written, _ = ledger.record(_step(3, STARTED))
    assert written and ledger.pending().seq == 3
    assert [(s.seq, s.status) for s in ledger.steps()] == [(1, STARTED), (1, COMMITTED), (2, STARTED), (2, COMMITTED),
                                                           (3, STARTED)]
    assert len(DeltaTable(uri).to_pyarrow_table()) == 5
