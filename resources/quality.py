"""Data quality: great-expectations 1.x as a Dagster resource, and the multiset comparison behind
the `matches_full_recompute` check.

great-expectations is called directly (dagster-ge supports only GE < 1.0): one ephemeral context
per process with one Spark data source that uses the process's own session (no `spark_config`, so
GE never restarts the session and drops the Delta settings), one whole-dataframe batch definition,
and a fresh suite per validation. Importing great_expectations takes seconds, so it never happens
when the code location loads: a step with checks imports it in a thread while its process's Spark
session starts (`GreatExpectationsResource.preload`), which waits on the JVM, not on Python.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from dagster import ConfigurableResource
from pydantic import Field

META_KEY = "epochal_check"  # names the check an expectation belongs to
RELATIVE_TOLERANCE = 1e-9  # DOUBLE sums drift under add and subtract; everything else is exact
_context_lock = threading.Lock()
_batch_definition = None
_preloading: threading.Thread | None = None


def _import_great_expectations() -> None:
    try:
        import great_expectations  # noqa: F401
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration  # noqa: F401
    except Exception:  # noqa: BLE001 - the validation that needs it imports it again and says why
        pass


@dataclass
class ExpectationOutcome:
    """One expectation's result on one batch of rows."""

    name: str
    type: str
    kwargs: dict
    scope: str
    success: bool
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    observed_value: Any = None
    partial_unexpected: list = field(default_factory=list)
    error: str | None = None


def _batch_definition_for_session():
    """The process's GE batch definition (ephemeral context, Spark data source, whole dataframe)."""
    global _batch_definition
    with _context_lock:
        if _batch_definition is None:
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            source = context.data_sources.add_spark("epochal")
            asset = source.add_dataframe_asset("epoch_rows")
            _batch_definition = asset.add_batch_definition_whole_dataframe("whole")
        return _batch_definition


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a GE result value (dates, decimals and the like become text)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class GreatExpectationsResource(ConfigurableResource):
    """Runs expectations (assets.specs.ExpectationSpec) on a Spark DataFrame with GE 1.x."""

    result_format: str = Field(
        default="SUMMARY",
        description="GE result format: BASIC, SUMMARY (unexpected counts and a sample) or COMPLETE",
    )

    def preload(self) -> threading.Thread:
        """Start importing great_expectations in a thread, once per process; join the thread it
        returns before anything else imports modules (a concurrent import of a module each
        side needs could see it half made). The batch definition waits for the validation: GE's
        Spark data source takes the session there is, and there is none yet."""
        global _preloading
        with _context_lock:
            if _preloading is None:
                _preloading = threading.Thread(target=_import_great_expectations, name="import great_expectations",
                                               daemon=True)
                _preloading.start()
            return _preloading

    def validate(self, frame, expectations: Sequence) -> list[ExpectationOutcome]:
        if not expectations:
            return []
        import great_expectations as gx
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        batch_definition = _batch_definition_for_session()  # first: a suite needs the context
        suite = gx.ExpectationSuite(name=f"epochal-{uuid.uuid4().hex}")
        by_name = {spec.name: spec for spec in expectations}
        outcomes: dict[str, ExpectationOutcome] = {}
        for spec in expectations:
            try:
                # The check's name rides in `meta`: results come back in no particular order, and
                # expectations of a suite that was never saved carry no id.
                expectation = ExpectationConfiguration(
                    type=spec.type, kwargs=dict(spec.kwargs), meta={META_KEY: spec.name}
                ).to_domain_obj()
            except Exception as error:  # an unknown type or bad arguments: the check fails saying why
                outcomes[spec.name] = ExpectationOutcome(
                    spec.name, spec.type, dict(spec.kwargs), spec.scope, False,
                    error=f"great-expectations rejects {spec.type}({dict(spec.kwargs)}): {error}",
                )
                continue
            suite.add_expectation(expectation)
        if suite.expectations:
            batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
            result = batch.validate(suite, result_format=self.result_format)
            for item in result.results:
                spec = by_name[(item.expectation_config.meta or {})[META_KEY]]
                details = dict(item.result or {})
                error = None
                info = item.exception_info or {}
                if info.get("raised_exception"):
                    error = info.get("exception_message") or "great-expectations raised an exception"
                outcomes[spec.name] = ExpectationOutcome(
                    name=spec.name,
                    type=spec.type,
                    kwargs=dict(spec.kwargs),
                    scope=spec.scope,
                    success=bool(item.success) and error is None,
                    element_count=details.get("element_count"),
                    unexpected_count=details.get("unexpected_count"),
                    unexpected_percent=details.get("unexpected_percent"),
                    observed_value=_plain(details.get("observed_value")),
                    partial_unexpected=_plain(details.get("partial_unexpected_list") or [])[:20],
                    error=error,
                )
        missing = [spec.name for spec in expectations if spec.name not in outcomes]
        if missing:
            raise RuntimeError(f"great-expectations returned no result for {', '.join(missing)}")
        return [outcomes[spec.name] for spec in expectations]


# ---- the full-recompute comparison ---------------------------------------------------------------

@dataclass
class Comparison:
    """A table against its full recompute, as multisets of rows."""

    rows: int
    expected_rows: int
    extra: int  # rows in the table beyond the recompute's (with multiplicity)
    missing: int  # rows of the recompute the table lacks
    sample_extra: list = field(default_factory=list)
    sample_missing: list = field(default_factory=list)
    approximate_columns: list = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return self.extra == 0 and self.missing == 0


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)
    return a == b


def compare_frames(actual, expected, *, limit: int = 20_000) -> Comparison:
    """Compare two DataFrames with the same columns as multisets, in one Spark job: both sides'
    rows are counted per distinct row (NULL equal to NULL, NaN to NaN, as exceptAll groups them),
    and the rows whose counts differ come back with both sides' totals. Rows left over are paired
    up on the driver allowing a relative difference of RELATIVE_TOLERANCE in DOUBLE/FLOAT columns
    (at most `limit` rows a side).

    One job, not four: exceptAll both ways and a count of each side evaluated the recompute three
    times and read each input version's snapshot each time (`python -m bench.check_costs`
    measures a check's jobs and seconds; bench/RESULTS.md has the before and after)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, DoubleType, FloatType, LongType

    columns = actual.columns
    fields = actual.schema.fields
    approximate = [i for i, f in enumerate(fields) if isinstance(f.dataType, (DoubleType, FloatType))]
    values = [f"_c{i}" for i in range(len(columns))]  # positional names: any column name is safe
    sides = ("_actual", "_expected")

    def tagged(frame, side: int):
        return frame.select(*[F.col(f"`{c}`").alias(v) for c, v in zip(columns, values)],
                            *[F.lit(int(i == side)).cast(LongType()).alias(s) for i, s in enumerate(sides)])

    counted = (tagged(actual, 0).union(tagged(expected, 1))
               .groupBy(*values).agg(*[F.sum(s).alias(s) for s in sides]))
    extra = F.greatest(F.col("_actual") - F.col("_expected"), F.lit(0))
    missing = F.greatest(F.col("_expected") - F.col("_actual"), F.lit(0))
    differing = counted.filter(F.col("_actual") != F.col("_expected")).limit(2 * limit + 2).select(
        *values, extra.alias("_extra"), missing.alias("_missing"), F.lit(False).alias("_total"))
    totals = counted.agg(*[F.lit(None).cast(f.dataType).alias(v) for f, v in zip(fields, values)],
                         F.sum(extra).alias("_extra"), F.sum(missing).alias("_missing"),
                         F.sum("_actual").alias("_rows"), F.sum("_expected").alias("_expected_rows"))
    found = differing.withColumn("_rows", F.lit(None).cast(LongType())) \
        .withColumn("_expected_rows", F.lit(None).cast(LongType())) \
        .unionByName(totals.withColumn("_total", F.lit(True).cast(BooleanType()))).collect()
    total = next(row for row in found if row["_total"])
    rows, expected_rows = total["_rows"] or 0, total["_expected_rows"] or 0
    extra_count, missing_count = total["_extra"] or 0, total["_missing"] or 0
    extra_rows, missing_rows = [], []
    for row in found:
        if not row["_total"]:
            value = tuple(row[v] for v in values)
            extra_rows += [value] * min(row["_extra"], limit + 1 - len(extra_rows))
            missing_rows += [value] * min(row["_missing"], limit + 1 - len(missing_rows))
    if extra_count > limit or missing_count > limit or not approximate:
        return Comparison(rows, expected_rows, extra_count, missing_count, extra_rows[:10], missing_rows[:10],
                          [columns[i] for i in approximate])
    exact = [i for i in range(len(columns)) if i not in approximate]
    pending: dict[tuple, list[tuple]] = defaultdict(list)
    for row in missing_rows:
        pending[tuple(row[i] for i in exact)].append(row)
    unmatched_extra = []
    for row in extra_rows:
        candidates = pending.get(tuple(row[i] for i in exact), [])
        match = next((c for c in candidates if all(_close(row[i], c[i]) for i in approximate)), None)
        if match is None:
            unmatched_extra.append(row)
        else:
            candidates.remove(match)
    unmatched_missing = [row for group in pending.values() for row in group]
    return Comparison(rows, expected_rows, len(unmatched_extra), len(unmatched_missing),
                      unmatched_extra[:10], unmatched_missing[:10], [columns[i] for i in approximate])


def multiset(frame) -> Counter:
    """A small frame's rows as a Counter (tests and diagnostics)."""
    return Counter(tuple(row) for row in frame.collect())
