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
