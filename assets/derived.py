"""One Dagster asset per derived table (assets/sql/<name>.sql, optional sidecar <name>.yml).

Each asset is time-partitioned (hourly by default, daily on request); a partition is an epoch
window. It depends on the tables its SQL reads (that is the lineage) and on its own previous
partition, so backfills apply partitions in order; with a single-run backfill policy a range is one
run, which processes the range as one epoch span (assets/partitions.py: one remap entry per
partition, one engine step for the span, the table's first partition on its own) and records one
materialization per partition. The sidecar's expectations run as blocking great-expectations checks
inside the step: row-level ones on the rows each epoch inserted, right after it; table-level ones on
the table after the run's last partition. A failed row-level expectation stops the range there.

No `from __future__ import annotations`: Dagster reads config and resource types from the
annotations of the asset function.
"""

import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Mapping, Sequence

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    BackfillPolicy,
    BetaWarning,
    Config,
    DailyPartitionsDefinition,
    Failure,
    HourlyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    TimeWindowPartitionMapping,
    TimeWindowPartitionsDefinition,
    asset,
)
from pydantic import Field

from assets.lineage import definition_metadata, engine_metadata
from assets.partitions import (
    ALREADY_APPLIED,
    PartitionOutcome,
    Window,
    apply_segment,
    inserted_rows,
    plan,
    row_count,
)
from assets.specs import ExpectationSpec, SpecError, TableSpec, period_start, upstream_chain
from epochal.errors import EpochalError
from resources.epochal import EpochalResource, cached_explain
from resources.quality import ExpectationOutcome, GreatExpectationsResource

_partitions: dict[tuple, TimeWindowPartitionsDefinition] = {}
# The partitions a run covers, as the run list shows it (Dagster's own range tags are hidden there).
PARTITIONS_TAG = "epochal/partitions"
# The log line that ends each materialization: its seconds per phase (the Spark session, which the run's
# first step starts; defining the tables; the engine's refresh; the row-level checks; the metadata; the
# table-level checks), as bench/dagster_run.py reads them.
SECONDS_LINE = "seconds by phase:"


class EpochConfig(Config):
    full_refresh: bool = Field(
        default=False,
        description="Rescan (reason REQUESTED) at the first partition of this run instead of applying "
        "changes: the table and its state are recomputed in full and the difference is written as one "
        "change; later partitions of the run are incremental again.",
    )


def partitions_for(spec: TableSpec) -> TimeWindowPartitionsDefinition:
    """The table's epochs as Dagster partitions (one shared definition per cadence and start)."""
    key = (spec.partitioning, spec.partition_start)
    if key not in _partitions:
        start = spec.partition_start.astimezone(timezone.utc)
        if spec.partitioning == "daily":
            if (start.hour, start.minute) != (0, 0):
                raise SpecError(f"{spec.sidecar_path}: a daily table's partition_start must be midnight UTC")
            _partitions[key] = DailyPartitionsDefinition(start_date=start.strftime("%Y-%m-%d"), timezone="UTC")
        else:
            if start.minute != 0:
                raise SpecError(f"{spec.sidecar_path}: an hourly table's partition_start must be on the hour")
            _partitions[key] = HourlyPartitionsDefinition(start_date=start.strftime("%Y-%m-%d-%H:%M"), timezone="UTC")
    return _partitions[key]


def _period(spec: TableSpec) -> timedelta:
    return timedelta(days=1) if spec.partitioning == "daily" else timedelta(hours=1)


def describe(spec: TableSpec, explain: str | None, sources_start: datetime | None = None) -> str:
    """The asset's description: what the table is, how it is partitioned and checked, how the
    engine maintains it (its last `explain`, when a run has defined the table), and its SQL.
    `sources_start` is the logical time of the warehouse's first source commit."""
    comment = [line.strip()[2:].strip() for line in spec.sql.splitlines() if line.strip().startswith("--")]
    lines = [spec.description or " ".join(comment[:3]) or f"Derived table {spec.name}.", ""]
    lines.append(f"- **reads**: {', '.join(spec.inputs)}")
    lines.append(f"- **epochs**: {spec.partitioning} partitions from {spec.partition_start:%Y-%m-%d %H:%M} UTC; "
                 "each partition is one epoch, applied in order")
    if sources_start is not None and spec.partition_start < period_start(sources_start, spec.partitioning):
        lines.append(f"- **sources start later**: the sources' first commit is stamped "
                     f"{sources_start:%Y-%m-%d %H:%M} UTC, so the partitions before it have no data "
                     "(each applies an empty epoch)")
    if spec.key:
        lines.append(f"- **key**: {', '.join(spec.key)}")
    if spec.expectations:
        lines.append(f"- **blocking checks**: {', '.join(e.name for e in spec.expectations)} (great-expectations)")
    lines.append("- **non-blocking check**: matches_full_recompute")
    if spec.strict:
        lines.append("- **strict**: fails instead of rescanning (except the first run)")
    lines += ["", "How the engine maintains it (`engine.explain`"
              + (", as of the last run that defined it):" if explain else "; shown after the first materialization)")]
    if explain:
        lines += ["```text", explain, "```"]
    lines += ["", f"SQL ({spec.sql_path.name}):", "```sql", spec.sql.strip(), "```"]
    return "\n".join(lines)


# ---- metadata -------------------------------------------------------------------------------

def materialization_metadata(engine, spec: TableSpec, outcome: PartitionOutcome, columns: dict) -> dict:
    """What one partition's materialization records. The epoch's figures (rows, seconds, phases,
    versions read) only on the partition that carries them (`PartitionOutcome.carries_figures`),
    so summing a column over partitions counts each epoch's work once; the row count only where
    the table has a version as of the partition's end. `columns`: the column schema and lineage
    (assets/lineage.py's `engine_metadata`), on every partition."""
    step = outcome.step
    first, last, count = outcome.span
    metadata = {
        "summary": MetadataValue.text(outcome.summary()),
        "outcome": "applied" if outcome.applied_now else ALREADY_APPLIED,
        "technique": step.technique,
        "reason": step.reason or "",
        "epoch": step.epoch,
        "partition_start": MetadataValue.timestamp(outcome.window.start),
        "partition_end": MetadataValue.timestamp(outcome.window.end),
        "epoch_span": f"{first} .. {last} ({count} partition{'s' if count != 1 else ''})",
        "figures_on": _figures_on(outcome),
        "source_versions_at_end": MetadataValue.json(outcome.source_versions),
        "ledger_seq": step.seq,
        **columns,
        "dagster/uri": MetadataValue.path(engine.table(spec.name).path),
    }
    if outcome.carries_figures:
        versions = ["| input | read from version | to version |", "| --- | --- | --- |"] + [
            f"| {name} | {v['from']} | {v['to']} |" for name, v in sorted(step.inputs.items())
        ]
        metadata.update({
            "input_versions": MetadataValue.md("\n".join(versions)),
            "rows_read": step.rows_read,
            "rows_inserted": step.rows_inserted,
            "rows_deleted": step.rows_deleted,
            "state_rows": step.state_rows,
            "seconds": float(step.seconds),
            "phases": MetadataValue.json(step.detail.get("phases", {})),
            "cost": MetadataValue.json(step.detail.get("cost", {})),
            # a rescan's commit: the full result over the table's rows (every row deleted and inserted), or its diff
            **({"rescan_written_as": "replaced: " + step.detail["replaced"]} if "replaced" in step.detail else {}),
        })
    if outcome.arrangements is not None and outcome.applied_now:  # builds, failures, copies not made
        metadata["arrangements"] = MetadataValue.json(outcome.arrangements)
    if outcome.ends_epoch:
        metadata["output_version"] = step.output_version
        rows = row_count(engine, spec.name, step.output_version)
        if rows is not None:
            metadata["dagster/row_count"] = rows
    return metadata


def _figures_on(outcome: PartitionOutcome) -> str:
    if outcome.carries_figures:
        return "this partition: its materialization applied the epoch"
    if not outcome.applied_now:
        return (f"partition {outcome.span[1]}, in the materialization that applied ledger step "
                f"{outcome.step.seq}; this one did nothing")
    return f"partition {outcome.span[1]}, where the epoch ends"


# ---- checks -----------------------------------------------------------------------------------

@dataclass
class RowCheck:
    """A row-level expectation over the epochs one run applied (each validated on its inserted rows)."""

    spec: ExpectationSpec
    partitions: int = 0
    epochs: int = 0
    rows: int = 0
    unexpected: dict = field(default_factory=dict)  # epoch's partitions -> unexpected rows
    sample: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)  # epoch's partitions -> error

    def add(self, label: str, partitions: int, outcome: ExpectationOutcome) -> bool:
        self.epochs += 1
        self.partitions += partitions
        self.rows += outcome.element_count or 0
        if outcome.error:
            self.errors[label] = outcome.error
        elif not outcome.success:
            self.unexpected[label] = outcome.unexpected_count or 0
            self.sample = self.sample or outcome.partial_unexpected
        return outcome.success

    def result(self, key: AssetKey) -> AssetCheckResult:
        total = sum(self.unexpected.values())
        if self.errors:
            label, error = next(iter(self.errors.items()))
            text = f"{self.spec.type} could not run on the rows of partition {label}: {error}"
        elif self.unexpected:
            text = (f"{self.spec.type}: {total} unexpected row(s) among the rows inserted by partition "
                    f"{', '.join(self.unexpected)}")
        elif self.rows:
            text = (f"{self.spec.type}: all {self.rows:,} rows inserted by {self.partitions} partition(s) "
                    f"({self.epochs} epoch{'s' if self.epochs != 1 else ''}) pass")
        else:
            text = f"{self.spec.type}: this run inserted no rows; nothing to validate"
        return AssetCheckResult(
            asset_key=key,
            check_name=self.spec.name,
            passed=not (self.errors or self.unexpected),
            description=text,
            metadata={
                "expectation": self.spec.type,
                "kwargs": MetadataValue.json(dict(self.spec.kwargs)),
                "scope": "the rows each epoch of this run inserted",
                "partitions_validated": self.partitions,
                "epochs_validated": self.epochs,
                "rows_validated": self.rows,
                "unexpected_count": total,
                "unexpected_by_partition": MetadataValue.json(self.unexpected),
                "partial_unexpected_list": MetadataValue.json(self.sample),
                **({"error": MetadataValue.json(self.errors)} if self.errors else {}),
            },
        )


def table_check_result(key: AssetKey, outcome: ExpectationOutcome, partition: str) -> AssetCheckResult:
    if outcome.error:
        text = f"{outcome.type} could not run: {outcome.error}"
    elif outcome.success:
        text = f"{outcome.type} holds for the table as of partition {partition}"
    else:
        count = "" if outcome.unexpected_count is None else f"{outcome.unexpected_count} unexpected row(s); "
        text = f"{outcome.type} fails for the table as of partition {partition}: {count}observed {outcome.observed_value}"
    metadata = {
        "expectation": outcome.type,
        "kwargs": MetadataValue.json(outcome.kwargs),
        "scope": f"the whole table as of partition {partition}",
        "rows_validated": outcome.element_count if outcome.element_count is not None else -1,
        "unexpected_count": outcome.unexpected_count if outcome.unexpected_count is not None else 0,
        "observed_value": MetadataValue.json({"value": outcome.observed_value}),
        "partial_unexpected_list": MetadataValue.json(outcome.partial_unexpected),
    }
    if outcome.error:
        metadata["error"] = MetadataValue.text(outcome.error)
    return AssetCheckResult(asset_key=key, check_name=outcome.name, passed=outcome.success,
                            description=text, metadata=metadata)


# ---- the asset --------------------------------------------------------------------------------

def derived_asset(spec: TableSpec, specs: Mapping[str, TableSpec], explain_root: str | None = None,
                  sources_start: datetime | None = None, columns: dict | None = None) -> AssetsDefinition:
    """The asset of one derived table. `columns`: its column schema and lineage as known at
    definition time (assets/lineage.py's `definition_metadata`)."""
    key = AssetKey(spec.name)
    partitions_def = partitions_for(spec)
    period = _period(spec)
    chain = upstream_chain(specs, spec.name)
    explain = cached_explain(explain_root, spec.name, spec.sql_sha) if explain_root else None
    deps = [AssetDep(name) for name in spec.inputs]
    deps.append(AssetDep(key, partition_mapping=TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)))
    check_specs = [
        AssetCheckSpec(e.name, asset=key, blocking=True, description=e.describe()) for e in spec.expectations
    ]

    def key_of(start: datetime) -> str:
        return start.astimezone(timezone.utc).strftime(partitions_def.fmt)

    def materialize(context: AssetExecutionContext, config: EpochConfig, epochal: EpochalResource,
                    great_expectations: GreatExpectationsResource):
        _tag_run_with_partitions(context)
        selected = {k.name for k in context.selected_asset_check_keys if k.asset_key == key}
        row_checks = [RowCheck(e) for e in spec.row_expectations if e.name in selected]
        table_checks = [e for e in spec.table_expectations if e.name in selected]
        seconds: Counter = Counter()
        clock = [time.perf_counter()]

        def lap(phase: str) -> None:
            now = time.perf_counter()
            seconds[phase] += now - clock[0]
            clock[0] = now

        importing = great_expectations.preload() if row_checks or table_checks else None
        epochal.spark.session()  # the run's first step starts Spark: timed apart from defining the tables
        if importing is not None:
            importing.join()
        lap("session")
        engine = epochal.define(chain)
        columns = engine_metadata(engine, spec)
        lap("define")
        windows = [Window(p, w.start, w.end) for p in context.partition_keys
                   for w in [partitions_def.time_window_for_partition_key(p)]]
        try:
            done, segments = plan(engine, spec.name, windows, key_of=key_of, period=period,
                                  full_refresh=config.full_refresh)
        except EpochalError as error:
            raise Failure(description=f"{spec.name}: {error}") from error
        outcomes: list[PartitionOutcome] = list(done)
        if done:
            context.log.info(f"{spec.name}: partition {done[0].partition}"
                             + (f" .. {done[-1].partition}" if len(done) > 1 else "")
                             + f" already applied ({done[-1].span_text()}); nothing to do for "
                             + ("them" if len(done) > 1 else "it"))
        for index, segment in enumerate(segments):
            label = segment[0].key if len(segment) == 1 else f"{segment[0].key} .. {segment[-1].key}"
            context.log.info(f"{spec.name}: applying partition {label} as one epoch ending "
                             f"{segment[-1].end.isoformat()}")
            lap("define")
            try:
                applied = apply_segment(engine, spec.name, segment, full_refresh=config.full_refresh and index == 0)
            except Exception as error:
                yield from _record_and_fail(context, engine, spec, columns, outcomes, row_checks,
                                            error, f"partition {label} failed")
                return
            lap("refresh")
            outcomes += applied
            context.log.info(applied[-1].summary())
            failed = _validate_rows(engine, great_expectations, applied[-1], label, len(segment), row_checks)
            lap("row checks")
            if failed and index < len(segments) - 1:
                rest = segments[index + 1:]
                why = (f"blocking check {', '.join(failed)} failed on the rows partition {label} inserted; "
                       f"partitions {rest[0][0].key} .. {rest[-1][-1].key} were not applied")
                yield from _record_and_fail(context, engine, spec, columns, outcomes, row_checks, None, why)
                return
        for outcome in outcomes:
            context.add_asset_metadata(materialization_metadata(engine, spec, outcome, columns),
                                       partition_key=outcome.partition)
        results = [check.result(key) for check in row_checks]
        lap("metadata")
        if table_checks:
            last = outcomes[-1].partition
            context.log.info(f"{spec.name}: validating {len(table_checks)} table-level expectation(s) "
                             f"on the table as of partition {last}")
            results += [table_check_result(key, o, last)
                        for o in great_expectations.validate(engine.read(spec.name, local=True), table_checks)]
            lap("table checks")
        context.log.info(f"{spec.name}: {SECONDS_LINE} " + ", ".join(f"{phase} {s:.2f}" for phase, s in seconds.items()))
        yield MaterializeResult(check_results=results)

    materialize.__name__ = spec.name
    with warnings.catch_warnings():  # backfill_policy is marked beta; it is the documented way
        warnings.simplefilter("ignore", BetaWarning)
        return asset(
            name=spec.name,
            deps=deps,
            partitions_def=partitions_def,
            backfill_policy=BackfillPolicy.single_run(),
            check_specs=check_specs,
            group_name=spec.group,
            description=describe(spec, explain, sources_start),
            kinds={"spark", "delta"},
            code_version=spec.sql_sha,
            metadata={
                "sql_file": MetadataValue.path(str(spec.sql_path)),
                "partitioning": spec.partitioning,
                "strict": spec.strict,
                **({"declared_key": ", ".join(spec.key)} if spec.key else {}),
                **(columns or {}),
            },
        )(materialize)


def _tag_run_with_partitions(context: AssetExecutionContext) -> None:
    """Tag the run with the partitions it covers, however it was launched (UI, CLI, schedule)."""
    keys = context.partition_keys
    covered = keys[0] if len(keys) == 1 else f"{keys[0]}...{keys[-1]}"
    if context.run.tags.get(PARTITIONS_TAG) != covered:
        context.instance.add_run_tags(context.run_id, {PARTITIONS_TAG: covered})


def _validate_rows(engine, great_expectations, outcome: PartitionOutcome, label: str, partitions: int,
                   row_checks: Sequence[RowCheck]) -> list[str]:
    """Run the row-level expectations on the rows an epoch inserted; the names that failed."""
    if not row_checks:
        return []
    frame = inserted_rows(engine, outcome)
    if frame is None:
        return []
    results = great_expectations.validate(frame, [check.spec for check in row_checks])
    return [check.spec.name for check, result in zip(row_checks, results)
            if not check.add(label, partitions, result)]


def _record_and_fail(context, engine, spec, columns, outcomes, row_checks, error, why):
    """A range stopped early: record the partitions that were applied (one materialization each,
    as in a successful run), the row-level check results so far, then fail the step, saying which
    partitions were applied and how to continue."""
    key = AssetKey(spec.name)
    for outcome in outcomes:
        yield AssetMaterialization(asset_key=key, partition=outcome.partition,
                                   metadata=materialization_metadata(engine, spec, outcome, columns))
    for check in row_checks:
        if check.epochs:
            yield check.result(key)
    applied = (f"partitions {outcomes[0].partition} .. {outcomes[-1].partition} are applied and recorded; "
               if outcomes else "no partition of this run was applied; ")
    rerun = ("re-running the same range skips the applied partitions (already applied; nothing done) "
             "and continues after them")
    if error is None:
        raise Failure(description=f"{spec.name}: {why}. {applied}fix the data, then {rerun}.")
    if isinstance(error, EpochalError):
        raise Failure(description=f"{spec.name}: {why}: {error}. {applied}{rerun}.") from error
    context.log.error(f"{spec.name}: {why}; {applied}{rerun}")
    raise error


def build_derived_assets(specs: Mapping[str, TableSpec], explain_root: str | None = None,
                         sources_start: datetime | None = None) -> list[AssetsDefinition]:
    columns = definition_metadata(specs, explain_root)
    return [derived_asset(spec, specs, explain_root, sources_start, columns[spec.name]) for spec in specs.values()]
