"""The non-blocking `matches_full_recompute` check of every derived table: the table as of its
last epoch against its SQL recomputed in full over the same input versions, compared as multisets
(duplicates count; DOUBLE columns within a relative 1e-9, DECIMAL and everything else exactly).
It is the engine's promise, checked: run it on demand, daily (the verify_recompute schedule), or
with a materialization.

No `from __future__ import annotations`: Dagster reads the resource types from the annotations.
"""

from typing import Mapping

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from assets.specs import TableSpec, upstream_chain
from epochal.storage.reclock import epoch_key
from resources.epochal import EpochalResource
from resources.quality import RELATIVE_TOLERANCE, compare_frames

RECOMPUTE_CHECK = "matches_full_recompute"


def recompute_check(spec: TableSpec, specs: Mapping[str, TableSpec]) -> AssetChecksDefinition:
    chain = upstream_chain(specs, spec.name)

    @asset_check(
        asset=spec.name,
        name=RECOMPUTE_CHECK,
        blocking=False,
        description=f"{spec.name} as of its last epoch equals its SQL recomputed in full over the same "
        f"input versions, row for row (DOUBLE within a relative {RELATIVE_TOLERANCE:g})",
    )
    def matches_full_recompute(context: AssetCheckExecutionContext, epochal: EpochalResource) -> AssetCheckResult:
        engine = epochal.define(chain)
        last = engine.table(spec.name).ledger.last_committed()
        if last is None:
            return AssetCheckResult(
                passed=False, severity=AssetCheckSeverity.WARN,
                description=f"{spec.name} has not been materialized yet: nothing to compare",
            )
        context.log.info(f"{spec.name}: comparing the table at version {last.output_version} (epoch "
                         f"{last.epoch}) with a full recompute")
        comparison = compare_frames(engine.read(spec.name), engine.recompute(spec.name))
        if comparison.equal:
            text = f"equal: {comparison.rows:,} rows, as of epoch {last.epoch}"
        else:
            text = (f"differs as of epoch {last.epoch}: {comparison.extra} row(s) too many, "
                    f"{comparison.missing} missing (table {comparison.rows:,} rows, recompute "
                    f"{comparison.expected_rows:,})")
        return AssetCheckResult(
            passed=comparison.equal,
            description=text,
            metadata={
                "epoch": last.epoch,
                "epoch_end": epoch_key(last.epoch_end),
                "table_version": last.output_version,
                "input_versions": MetadataValue.json({n: v["to"] for n, v in sorted(last.inputs.items())}),
                "rows": comparison.rows,
                "recompute_rows": comparison.expected_rows,
                "rows_too_many": comparison.extra,
                "rows_missing": comparison.missing,
                "sample_too_many": MetadataValue.json([list(map(str, r)) for r in comparison.sample_extra]),
                "sample_missing": MetadataValue.json([list(map(str, r)) for r in comparison.sample_missing]),
                "approximate_columns": MetadataValue.json(comparison.approximate_columns),
            },
        )

    return matches_full_recompute


def build_recompute_checks(specs: Mapping[str, TableSpec]) -> list[AssetChecksDefinition]:
    return [recompute_check(spec, specs) for spec in specs.values()]
