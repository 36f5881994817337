"""The demo's per-table summary of a materialization run over a partition range and the verify
run: partitions and the epochs (ledger steps) that applied them, the technique per partition (R
rescan, I incremental, N noop; lower case when the partition was already applied before the run),
rows changed and engine seconds per table (each epoch counted once, however many partitions it
spans), checks passed, and why a table rescanned."""

from __future__ import annotations

from collections import defaultdict

LETTERS = {"rescan": "R", "incremental": "I", "noop": "N"}


def runs(codes: list[str]) -> str:
    """['R', 'I', 'I', 'I'] -> 'R I×3'."""
    out: list[str] = []
    previous, count = None, 0
    for code in codes + [None]:
        if code == previous:
            count += 1
            continue
        if previous is not None:
            out.append(previous if count == 1 else f"{previous}×{count}")
        previous, count = code, 1
    return " ".join(out)


def _value(metadata, key, default=None):
    entry = metadata.get(key)
    return default if entry is None else entry.value


def summarize(result, verified, tables: list[str], partitions: int) -> tuple[str, bool]:
    """(text, everything passed) for the materialization run `result` and the verify run."""
    by_table: dict[str, dict[str, dict]] = defaultdict(dict)
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        by_table[materialization.asset_key.to_user_string()][materialization.partition] = materialization.metadata
    checks: dict[str, list] = defaultdict(list)
    for evaluation in [*result.get_asset_check_evaluations(), *verified.get_asset_check_evaluations()]:
        checks[evaluation.asset_key.to_user_string()].append(evaluation)
    failed = {e.step_key: e.event_specific_data.error.message.strip().splitlines()[0]
              for e in [*result.get_step_failure_events(), *verified.get_step_failure_events()]}
    skipped = {e.step_key for e in result.get_step_skipped_events()}

    header = (f"{'table':<18} {'parts':>5} {'epochs':>6}  {'techniques':<12} {'rows +ins/-del':>16} "
              f"{'engine s':>8}  {'checks':<14} notes")
    lines = [header, "-" * len(header)]
    ok, incremental_after_first, notes_below = True, 0, []
    for table in tables:
        parts = by_table.get(table, {})
        codes, inserted, deleted, seconds, reasons = [], 0, 0, 0.0, defaultdict(set)
        steps: set = set()  # the epochs (ledger steps) behind the partitions
        for partition in sorted(parts):
            metadata = parts[partition]
            technique = _value(metadata, "technique", "?")
            letter = LETTERS.get(technique, "?")
            if _value(metadata, "outcome") != "applied":
                letter = letter.lower()
            codes.append(letter)
            step = _value(metadata, "ledger_seq", partition)
            steps.add(step)
            if technique == "rescan":
                reasons[_value(metadata, "reason", "")].add(step)
            # an epoch's figures are on one partition only (the one it ends with, if applied now)
            inserted += _value(metadata, "rows_inserted", 0)
            deleted += _value(metadata, "rows_deleted", 0)
            seconds += _value(metadata, "seconds", 0.0)
        evaluations = checks.get(table, [])
        passed = sum(1 for e in evaluations if e.passed)
        failing = [e.check_name for e in evaluations if not e.passed]
        notes = []
        if table in failed:
            notes.append(f"FAILED: {failed[table]}")
        elif table in skipped or not parts:
            notes.append("not run (an upstream step failed)")
        if len(parts) != partitions:
            notes.append(f"{len(parts)} of {partitions} partitions")
        if failing:
            notes.append("checks failed: " + ", ".join(failing))
        for reason, where in reasons.items():
            label = "FIRST_RUN" if reason == "FIRST_RUN" else reason
            notes.append(f"R {label}" + (f" ×{len(where)}" if len(where) > 1 else ""))
        if codes and all(c.upper() != "R" for c in codes[1:]):
            incremental_after_first += 1
        ok = ok and table not in failed and len(parts) == partitions and not failing and bool(evaluations)
        check_text = f"{passed}/{len(evaluations)} passed"
        note = "; ".join(notes)
        if len(note) > 70:
            notes_below.append(f"  {table}: {note}")
            note = note[:67] + "..."
        lines.append(f"{table:<18} {len(parts):>5} {len(steps):>6}  {runs(codes):<12} "
                     f"{f'+{inserted:,}/-{deleted:,}':>16} {seconds:>8.1f}  {check_text:<14} {note}")
    lines.append("-" * len(header))
    lines.append(f"{incremental_after_first} of {len(tables)} tables incremental in every partition after the "
                 "first (R rescan, I incremental, N noop: nothing changed; lower case: applied before this run)")
    if notes_below:
        lines += ["notes in full:", *notes_below]
    lines.append("all partitions applied and every check passed" if ok else
                 "NOT OK: a table failed, a partition is missing or a check did not pass (see above)")
    return "\n".join(lines), ok
