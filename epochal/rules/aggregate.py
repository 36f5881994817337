"""GROUP BY with aggregates; DISTINCT is the aggregate with no aggregates.

State: one row per group, `__count` (the group's row count) and per aggregate what it needs to
be updated from a change batch alone: a sum and a non-NULL count for SUM and AVG, a non-NULL count
for COUNT, the current value for MIN and MAX, the number of distinct values for COUNT(DISTINCT x)
(with a use-count table per (group, x): the guard counts of "How Pulley Produces Incremental
Output"). Rule, per touched group:

    new state = old state + aggregate of d (weights multiply values)
    output    = -finalize(old state) if the group existed, +finalize(new state) if it exists now

MIN/MAX fold in place for groups touched only by inserts; groups touched by a delete, and every
touched group of an aggregate without an invertible form, are recomputed from `new` restricted to
those groups. A group whose visible row did not change cancels out in consolidation. A global
aggregate (no GROUP BY) always has its one row.
"""

from __future__ import annotations

import decimal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    LongType,
    StructField,
    StructType,
)

from ..arrow_rows import computed_rows, exact_rows, first_values, held_exactly, hold, key_tuples, key_type, keys_in, lazy_frame, spark_typed
from ..changes import NEW, OLD, consolidate, null_safe_on, quoted, restrict
from ..driver.aggregates import (
    COUNT,
    adds_exactly,
    distinct_transitions,
    finalized_rows,
    finalized_state,
    folded_groups,
    grouped_in_arrow,
    state_columns_of,
    state_types,
    sum_type,
    touched_in_arrow,
    touched_rows,
    use_count_changes,
    weighs_exactly,
)
from ..graph import WEIGHT, AggCall, Aggregate, sql
from ..keyed.state import DELETE_FLAG
from ..narrowing import restricted_snapshot
from ..reasons import NOT_EXACT
from .base import Rule, analysed_schema

FOLDED = ("count_star", "count", "sum", "avg")


def c(name: str):
    return F.col(quoted(name))


def decimal_average_udf(result: DecimalType, ansi: bool):
    """A UDF of (sum, count) giving Spark's AVG of a decimal (driver.aggregates.decimal_average):
    the exact quotient rounded half-up to `result`; past its precision NULL, or under ANSI mode
    Spark's error. Defined in here so that it is pickled whole, with nothing to import."""
    def average(total, count):
        if total is None or not count:
            return None
        quotient = decimal.Context(prec=120, rounding=decimal.ROUND_DOWN).divide(total, decimal.Decimal(count))
        fitted = quotient.quantize(decimal.Decimal(1).scaleb(-result.scale), rounding=decimal.ROUND_HALF_UP,
                                   context=decimal.Context(prec=120))
        if fitted.adjusted() >= result.precision - result.scale:
            if ansi:
                raise ArithmeticError(f"[NUMERIC_VALUE_OUT_OF_RANGE] the average {fitted} does not fit "
                                      f"DECIMAL({result.precision},{result.scale})")
            return None
        return fitted

    return F.udf(average, result)


def _needs_recompute(agg: AggCall) -> bool:
    return agg.func in ("min", "max", "other")


def new_state(touched: DataFrame, keys: list[str], state_columns: list[str]) -> DataFrame:
    """The touched groups' new state rows, a group whose count fell to zero flagged deleted."""
    exists = (c("n__" + COUNT) > 0) | F.lit(not keys)
    return touched.select(*[c(k) for k in keys], *[c("n__" + s).alias(s) for s in state_columns],
                          (~exists).alias(DELETE_FLAG))


def new_state_schema(keys: list[str], state_columns: list[str], touched: StructType) -> StructType:
    """The schema of _queue_state's new state over touched groups of schema `touched`, as Spark's
    analysis gives it: the keys and new state columns as they are, the delete flag nullable where
    the new count is."""
    return StructType([StructField(k, touched[k].dataType, touched[k].nullable) for k in keys] +
                      [StructField(s, touched["n__" + s].dataType, touched["n__" + s].nullable) for s in state_columns] +
                      [StructField(DELETE_FLAG, BooleanType(), touched["n__" + COUNT].nullable)])


class AggregateRule(Rule):
    operator = Aggregate
    rule = "new state = old state + γ(d); emit -finalize(old), +finalize(new) per touched group"

    def stateful(self, node: Aggregate) -> bool:
        return True

    def explain(self, node: Aggregate) -> tuple[str, str]:
        state = f"per group ({', '.join(node.keys) or 'one row'}): __count"
        for agg in node.aggs:
            state += ", " + ", ".join(state_columns_of(agg) or [f"{agg.name} = __count"])
        distinct = [a for a in node.aggs if a.distinct]
        if distinct:
            state += "; use-count tables for " + ", ".join(f"{a.name}({a.arg})" for a in distinct)
        recomputes = [a.name for a in node.aggs if _needs_recompute(a) and not a.distinct]
        rule = self.rule
        if recomputes:
            rule += f"; {', '.join(recomputes)} recomputed from new for groups touched by deletes"
            if any(a.func == "other" for a in node.aggs):
                rule += " (every touched group for non-invertible aggregates)"
        if not node.aggs:
            rule = "use-count per distinct row: a row appears on 0 -> positive, disappears on positive -> 0"
        return rule, state

    # ---- types -----------------------------------------------------------------------------
    def _input_schema(self, node: Aggregate, ctx) -> StructType:
        """From the change batch where there is one (a local relation, where the snapshot may be
        a time-travel read Delta must open to say its schema)."""
        def schema():
            change = ctx.delta(node.input) if not ctx.rescan and ctx.changed(node.input) else None
            return (change if change is not None else ctx.snapshot(node.input, NEW)).schema

        return ctx.memo(node, "input_schema", schema)

    def _input_type(self, node: Aggregate, ctx, column: str) -> DataType:
        return self._input_schema(node, ctx)[column].dataType

    def _sum_type(self, node: Aggregate, ctx, agg: AggCall) -> DataType:
        return ctx.memo(node, f"sum_type:{agg.name}", lambda: sum_type(self._input_type(node, ctx, agg.arg)) or
                        ctx.snapshot(node.input, NEW).select(F.sum(c(agg.arg))).schema[0].dataType)

    def _finalize(self, node: Aggregate, ctx, prefix: str) -> list:
        """Visible aggregate values from state columns named `prefix + state column`."""
        out = []
        for agg in node.aggs:
            p = lambda name: c(prefix + name)  # noqa: E731
            if agg.func == "count_star":
                value = p(COUNT)
            elif agg.func == "count":
                value = p(f"{agg.name}__n")
            elif agg.func == "sum":
                value = F.when(p(f"{agg.name}__n") > 0, p(f"{agg.name}__s")).cast(self._sum_type(node, ctx, agg))
            elif agg.func == "avg":
                value = F.when(p(f"{agg.name}__n") > 0, self._average(node, ctx, agg, p))
            elif agg.func in ("min", "max"):
                value = p(f"{agg.name}__m")
            else:
                value = p(f"{agg.name}__v")
            out.append(value.alias(agg.name))
        return out

    def _average(self, node, ctx, agg: AggCall, p):
        """AVG as Spark's Average computes it from its sum and count. For decimals that is one
        half-up rounding of the quotient to the average's type, which no Spark expression over the
        two gives (its division is typed by the precision rules: for a DECIMAL(38,10) sum it keeps
        10 places of the average's 14, and it rounds twice): Python's exact division, as a UDF."""
        total, count = p(f"{agg.name}__s"), p(f"{agg.name}__n")
        arg_type = self._input_type(node, ctx, agg.arg)
        if isinstance(arg_type, DecimalType):
            result = DecimalType(min(38, arg_type.precision + 4), min(38, arg_type.scale + 4))
            return decimal_average_udf(result, ctx.ansi)(total, count)
        result_type = DoubleType() if isinstance(arg_type, (IntegralType, DoubleType, FloatType)) else \
            ctx.snapshot(node.input, NEW).select(F.avg(c(agg.arg))).schema[0].dataType
        return (total.cast(DoubleType()) / count.cast(DoubleType())).cast(result_type)

    # ---- full state ---------------------------------------------------------------------------
    def _full_state(self, node: Aggregate, ctx, side: str) -> DataFrame:
        return ctx.full_state(node, side, lambda: self._computed_full_state(node, ctx, side))

    def _computed_full_state(self, node: Aggregate, ctx, side: str) -> DataFrame:
        rows = ctx.snapshot(node.input, side)
        parts = [F.count(F.lit(1)).alias(COUNT)]
        for agg in node.aggs:
            if agg.func == "count_star":
                continue
            if agg.distinct:
                parts.append(F.count_distinct(c(agg.arg)).alias(f"{agg.name}__n"))
            elif agg.func in ("sum", "avg"):
                parts.append(F.sum(c(agg.arg)).cast(self._sum_type(node, ctx, agg)).alias(f"{agg.name}__s"))
                parts.append(F.count(c(agg.arg)).alias(f"{agg.name}__n"))
            elif agg.func == "count":
                parts.append(F.count(c(agg.arg)).alias(f"{agg.name}__n"))
            elif agg.func in ("min", "max"):
                fn = F.min if agg.func == "min" else F.max
                parts.append(fn(c(agg.arg)).alias(f"{agg.name}__m"))
            else:
                parts.append(F.expr(sql(agg.expression)).alias(f"{agg.name}__v"))
        return rows.groupBy(*[c(k) for k in node.keys]).agg(*parts)

    def _full_use_counts(self, node: Aggregate, ctx, agg: AggCall, side: str) -> DataFrame:
        rows = ctx.snapshot(node.input, side).filter(c(agg.arg).isNotNull())
        return rows.groupBy(*[c(k) for k in node.keys], c(agg.arg)).agg(F.count(F.lit(1)).alias(COUNT))

    def build_state(self, node: Aggregate, ctx) -> None:
        name = ctx.state_name(node)
        ctx.state.overwrite(name, self._full_state(node, ctx, NEW), node.keys)
        for agg in node.aggs:
            if agg.distinct:
                ctx.state.overwrite(f"{name}_{agg.name}", self._full_use_counts(node, ctx, agg, NEW),
                                    node.keys + (agg.arg,))

    # ---- incremental -----------------------------------------------------------------------
    def _weighted(self, node: Aggregate, ctx, agg: AggCall):
        """The column SUM adds for one change row: its value times its weight, exactly. Spark types
        DECIMAL(p,s) * BIGINT as DECIMAL(p+21, s) and, past 38 digits with s > 6, rounds the product
        to 6 places; there the change is first split into rows of weight 1 or -1 (_unit_weights),
        and the weight is a sign."""
        arg, weight = c(agg.arg), F.col(WEIGHT)
        arg_type = self._input_type(node, ctx, agg.arg)
        if isinstance(arg_type, DecimalType):
            if weighs_exactly(arg_type):
                return arg * weight
            return F.when(weight > 0, arg).otherwise(-arg)
        return arg.cast(self._sum_type(node, ctx, agg)) * weight  # FLOAT's product in DOUBLE, as SUM adds it

    def _unit_weights(self, node: Aggregate, ctx, change: DataFrame) -> DataFrame:
        """`change` with each row of weight w as |w| rows of weight sign(w), where a sum's product
        with the weight would round (_weighted); else as it is."""
        if not any(agg.func in ("sum", "avg") and not agg.distinct and
                   isinstance(self._input_type(node, ctx, agg.arg), DecimalType) and
                   not weighs_exactly(self._input_type(node, ctx, agg.arg)) for agg in node.aggs):
            return change
        weight = F.col(WEIGHT)
        return change.withColumn(WEIGHT, F.explode(F.array_repeat(F.signum(weight).cast(LongType()),
                                                                  F.abs(weight).cast("int"))))

    def _grouped_change(self, node: Aggregate, ctx, change: DataFrame) -> DataFrame:
        change = self._unit_weights(node, ctx, change)
        weight = F.col(WEIGHT)
        parts = [F.sum(weight).alias(COUNT), F.max(F.when(weight < 0, 1).otherwise(0)).alias("__neg")]
        for agg in node.aggs:
            if agg.distinct or agg.func in ("count_star", "other"):
                continue
            arg = c(agg.arg)
            if agg.func in ("sum", "avg"):
                parts.append(F.sum(self._weighted(node, ctx, agg)).cast(self._sum_type(node, ctx, agg))
                             .alias(f"{agg.name}__s"))
                parts.append(F.count(arg).alias(f"{agg.name}__c"))  # values, so a NULL sum is an overflow
            if agg.func in ("sum", "avg", "count"):
                parts.append(F.sum(F.when(arg.isNotNull(), weight).otherwise(0)).alias(f"{agg.name}__n"))
            if agg.func in ("min", "max"):
                fn = F.min if agg.func == "min" else F.max
                parts.append(fn(F.when(weight > 0, arg)).alias(f"{agg.name}__m"))
                parts.append(
                    F.max(F.when((weight < 0) & arg.isNotNull(), 1).otherwise(0)).alias(f"{agg.name}__neg")
                )
        return change.groupBy(*[c(k) for k in node.keys]).agg(*parts)

    def _distinct_changes(self, node: Aggregate, ctx, agg: AggCall, change: DataFrame) -> DataFrame:
        """Queue the use-count changes for COUNT(DISTINCT arg); return per group the change in the
        number of distinct values (a value counts while its use count is positive)."""
        keys = list(node.keys)
        counted = (
            change.filter(c(agg.arg).isNotNull())
            .groupBy(*[c(k) for k in keys], c(agg.arg))
            .agg(F.sum(WEIGHT).alias("__d"))
            .filter(F.col("__d") != 0)
        )
        name = f"{ctx.state_name(node)}_{agg.name}"
        old = ctx.state.read(name, keys + [agg.arg], restrict=counted)
        old = old.select(*[c(x).alias("o__" + x) for x in old.columns])
        joined = counted.join(
            old, null_safe_on(counted, old, [(x, "o__" + x) for x in keys + [agg.arg]]), "left"
        )
        before = F.coalesce(c("o__" + COUNT), F.lit(0))
        after = before + F.col("__d")
        transitions = joined.select(
            *[c(x) for x in keys + [agg.arg]],
            after.alias(COUNT),
            (F.when((before <= 0) & (after > 0), 1).when((before > 0) & (after <= 0), -1).otherwise(0)).alias("__t"),
        )
        transitions = ctx.materialize(transitions)
        ctx.state.merge(
            name,
            transitions.select(*[c(x) for x in keys + [agg.arg]], c(COUNT), (c(COUNT) <= 0).alias(DELETE_FLAG)),
            tuple(keys + [agg.arg]),
            checks=[(f"a use count below zero in {name}", f"`{COUNT}` < 0")],
        )
        per_group = transitions.groupBy(*[c(k) for k in keys]).agg(F.sum("__t").alias(f"{agg.name}__dn"))
        return per_group

    def _touched(self, node: Aggregate, ctx) -> DataFrame:
        """Per touched group: keys, old state (o__*), new state (n__*). Computing it queues the
        state merge (once), so the state advances whether readers take the delta or only
        snapshots (a top-k over an aggregate reads only snapshots)."""
        return ctx.memo(node, "touched", lambda: self._queue_state(node, ctx, self._compute_touched(node, ctx)))

    def _queue_state(self, node: Aggregate, ctx, touched: DataFrame) -> DataFrame:
        keys = list(node.keys)
        state_columns = [COUNT] + [s for a in node.aggs for s in state_columns_of(a)]
        held, rows = None, computed_rows(touched)
        if rows is not None:  # the same rows and check, in Arrow
            count = rows.column("n__" + COUNT)
            gone = pc.less_equal(count, 0) if keys else pa.array([False] * rows.num_rows)
            sums = [(f"{a.name}__n", f"{a.name}__s") for a in node.aggs if a.func in ("sum", "avg") and not a.distinct]
            overflowed = [pc.fill_null(pc.and_(pc.greater(rows.column("n__" + n), 0), pc.is_null(rows.column("n__" + s))),
                                       False) for n, s in sums]
            held = pa.Table.from_arrays(
                [*[rows.column(k) for k in keys], *[rows.column("n__" + s) for s in state_columns], gone,
                 pc.less(count, 0), *overflowed],
                names=[*keys, *state_columns, DELETE_FLAG, "__bad0", *[f"__bad{i + 1}" for i in range(len(sums))]])
        if held is not None:  # Spark's frame only if the state is written by Spark
            schema = new_state_schema(keys, state_columns, touched.schema)
            merged = lazy_frame(ctx.spark, lambda: new_state(touched, keys, state_columns), schema)
        else:
            merged = new_state(touched, keys, state_columns)
        ctx.state.merge(
            ctx.state_name(node),
            merged,
            tuple(keys),
            checks=[(f"a group count below zero in {ctx.state_name(node)}", f"`{COUNT}` < 0"),
                    *self._overflow_checks(node, ctx)],
            held=held,
        )
        return touched

    def _overflow_checks(self, node: Aggregate, ctx) -> list[tuple[str, str, str]]:
        """Per SUM or AVG, a refusal where its running sum went past its type, or, in floating
        point, became NaN or an infinity (NULL in the state while the group has values): from then
        on the state cannot answer as the recompute would. NaN - NaN is NaN and inf - inf is NaN,
        so a sum holding either cannot tell when the row that brought it leaves."""
        def problem(agg: AggCall) -> str:
            sum_type = self._sum_type(node, ctx, agg)
            if isinstance(sum_type, DoubleType):
                return f"the running sum of {agg.func}({agg.arg}) holds NaN or an infinity in {ctx.state_name(node)}"
            return f"the running sum of {agg.func}({agg.arg}) went past its type {sum_type.simpleString()} in " \
                   f"{ctx.state_name(node)}"

        return [(problem(agg), f"`{agg.name}__n` > 0 AND `{agg.name}__s` IS NULL", NOT_EXACT)
                for agg in node.aggs if agg.func in ("sum", "avg") and not agg.distinct]

    def _touched_on_driver(self, node: Aggregate, ctx) -> DataFrame | None:
        """_compute_touched in Python (driver/aggregates.py) where the change is held exactly on
        the driver and so are the state rows of its groups; None where it is Spark's."""
        change = ctx.delta(node.input)
        rows = exact_rows(change)
        if rows is None:
            return None
        schema = change.schema
        input_types = {f.name: f.dataType for f in schema.fields}
        types = state_types(node, input_types)
        if types is None or not all(key_type(input_types[k]) for k in node.keys):
            return None
        rows = spark_typed(rows, schema)
        if rows is None:
            return None
        keys = list(node.keys)
        arrow_grouped = grouped_in_arrow(node, rows)
        columnar = touched_in_arrow(node, arrow_grouped, lambda wanted: ctx.state.latest_table_of_keys(
            ctx.state_name(node), keys, wanted), input_types, types)
        if columnar is not None:
            return hold(ctx.reads.local(ctx.spark, columnar[0], columnar[1]), columnar[0], exact=True)
        wanted = list(set(key_tuples(rows, list(node.keys)))) if node.keys else [()]
        old = ctx.state.latest_on_driver(ctx.state_name(node), list(node.keys), wanted)
        if old is None:
            return None
        use_counts, per_group = {}, {}
        for agg in node.aggs:
            if agg.distinct:
                found = self._use_counts_on_driver(node, ctx, agg, rows, input_types)
                if found is None:
                    return None
                use_counts[agg.name], per_group[agg.name] = found
        found = touched_rows(node, rows, old, input_types, types, lambda groups: self._input_on_driver(node, ctx, groups),
                             per_group, folded_groups(node, arrow_grouped) if arrow_grouped is not None else None)
        if found is None:
            return None
        for name, (frame, held, keys) in use_counts.items():  # queued only once the step is the driver's
            ctx.state.merge(f"{ctx.state_name(node)}_{name}", frame, keys,
                            checks=[(f"a use count below zero in {ctx.state_name(node)}_{name}", f"`{COUNT}` < 0")],
                            held=held)
        touched, touched_schema = found
        return hold(ctx.reads.local(ctx.spark, touched, touched_schema), touched, exact=True)

    def _use_counts_on_driver(self, node: Aggregate, ctx, agg: AggCall, rows: pa.Table, input_types: dict):
        """_distinct_changes in Python over the change's Arrow `rows`: the use-count merge (as a
        local relation, its Arrow rows with the check's flag, and its keys) and per group the
        change in the number of distinct values; None where the use counts are Spark's to read."""
        keys = list(node.keys) + [agg.arg]
        if agg.arg in node.keys:
            return None
        counted = use_count_changes(list(node.keys), agg.arg, rows)
        old = ctx.state.latest_on_driver(f"{ctx.state_name(node)}_{agg.name}", keys, list(counted))
        if old is None:
            return None
        after, per_group = distinct_transitions(counted, old, COUNT)
        schema = StructType([StructField(k, input_types[k]) for k in keys] + [StructField(COUNT, LongType())])
        arrow = to_arrow_schema(schema)
        try:
            merged = pa.table([*[pa.array([key[i] for key in after], type=arrow.field(i).type) for i in range(len(keys))],
                               pa.array(list(after.values()), pa.int64())], schema=arrow)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return None
        count = merged.column(COUNT)
        held = merged.append_column(DELETE_FLAG, pc.less_equal(count, 0)).append_column("__bad0", pc.less(count, 0))
        frame = ctx.reads.local(ctx.spark, held.drop_columns(["__bad0"]),
                                StructType(schema.fields + [StructField(DELETE_FLAG, BooleanType())]))
        return (frame, held, tuple(keys)), per_group

    def _input_on_driver(self, node: Aggregate, ctx, groups: set[tuple]):
        """The input's rows of at least `groups` as of the epoch's end, held exactly on the
        driver (Spark-typed Arrow), or None."""
        keys = list(node.keys)
        frame = None
        if keys:
            wanted = first_values(groups)
            if wanted is None:
                return None
            frame = restricted_snapshot(ctx, node.input, NEW, keys[0], wanted)
        if frame is None:
            frame = ctx.snapshot(node.input, NEW)  # a small input is held whole
        rows = exact_rows(frame) if held_exactly(frame) else None
        return spark_typed(rows, frame.schema) if rows is not None else None

    def _compute_touched(self, node: Aggregate, ctx) -> DataFrame:
        on_driver = self._touched_on_driver(node, ctx)
        if on_driver is not None:
            return on_driver
        keys = list(node.keys)
        change = ctx.delta(node.input)
        grouped = self._grouped_change(node, ctx, change)
        for agg in node.aggs:
            if agg.distinct:
                per_group = self._distinct_changes(node, ctx, agg, change)
                renamed = per_group.select(*[c(k).alias("g__" + k) for k in keys], c(f"{agg.name}__dn"))
                grouped = grouped.join(renamed, null_safe_on(grouped, renamed, [(k, "g__" + k) for k in keys]), "left")
                grouped = grouped.drop(*["g__" + k for k in keys])
        old = ctx.state.read(ctx.state_name(node), keys, restrict=grouped)
        old = old.select(*[c(x).alias("o__" + x) for x in old.columns])
        joined = self._exact_sums(node, ctx, grouped.join(old, null_safe_on(grouped, old, [(k, "o__" + k) for k in keys]),
                                                          "left"))

        zero = F.lit(0).cast(LongType())
        new = [c(k) for k in keys]
        new.append((F.coalesce(c("o__" + COUNT), zero) + F.coalesce(c(COUNT), zero)).alias("n__" + COUNT))
        for agg in node.aggs:
            for column in state_columns_of(agg):
                old_value, change_value = c("o__" + column), c(column)
                if column.endswith("__n") and agg.distinct:
                    value = F.coalesce(old_value, zero) + F.coalesce(c(f"{agg.name}__dn"), zero)
                elif column.endswith("__n"):
                    value = F.coalesce(old_value, zero) + F.coalesce(change_value, zero)
                elif column.endswith("__s"):
                    sum_type = self._sum_type(node, ctx, agg)
                    overflowed = ((c(f"o__{agg.name}__n") > 0) & old_value.isNull()) | \
                        ((c(f"{agg.name}__c") > 0) & change_value.isNull())  # a sum past its type: refused
                    if adds_exactly(sum_type):
                        value = (F.coalesce(old_value, F.lit(0).cast(sum_type)) +
                                 F.coalesce(change_value, F.lit(0).cast(sum_type))).cast(sum_type)
                    else:
                        value = c(f"{agg.name}__x")
                    if isinstance(sum_type, DoubleType):  # NaN or an infinity cannot be taken back out: refused
                        overflowed = overflowed | F.isnan(value) | (F.abs(value) == float("inf"))
                    value = F.when(overflowed, F.lit(None).cast(sum_type)).otherwise(value)
                elif column.endswith("__m"):
                    fold = F.least if agg.func == "min" else F.greatest
                    value = F.when(c(f"{agg.name}__neg") == 1, F.lit(None)).otherwise(fold(old_value, change_value))
                else:
                    value = F.lit(None)
                new.append(value.cast(self._state_type(node, ctx, agg, column)).alias("n__" + column))
        old_columns = [c("o__" + x) for x in [COUNT] + [s for a in node.aggs for s in state_columns_of(a)]]
        touched = joined.select(*new, *old_columns, c("__neg"), *[c(f"{a.name}__neg") for a in node.aggs if a.func in ("min", "max")])
        return ctx.materialize(self._recompute(node, ctx, touched))

    def _exact_sums(self, node: Aggregate, ctx, joined: DataFrame) -> DataFrame:
        """`joined` (the change grouped, beside each group's old state) with `<agg>__x`, the old
        sum plus the change's, for each sum whose type Spark's `+` would round (a DECIMAL(38,s)
        with s > 6 plus another is typed DECIMAL(38,s-1)). SUM itself adds exactly in its own type,
        so the two are added by SUM: each group's old and change sums as two rows, summed."""
        wide = [agg for agg in node.aggs if agg.func in ("sum", "avg") and not agg.distinct and
                not adds_exactly(self._sum_type(node, ctx, agg))]
        if not wide:
            return joined
        keys = list(node.keys)
        side = lambda prefix: F.struct(*[c(f"{prefix}{a.name}__s").alias(f"{a.name}__x") for a in wide])  # noqa: E731
        pairs = joined.select(*[c(k).alias("x__" + k) for k in keys], F.inline(F.array(side("o__"), side(""))))
        summed = pairs.groupBy(*[c("x__" + k) for k in keys]).agg(
            *[F.sum(c(f"{a.name}__x")).cast(self._sum_type(node, ctx, a)).alias(f"{a.name}__x") for a in wide])
        if not keys:
            return joined.crossJoin(summed)
        return joined.join(summed, null_safe_on(joined, summed, [(k, "x__" + k) for k in keys]), "left") \
            .drop(*["x__" + k for k in keys])

    def _state_type(self, node, ctx, agg: AggCall, column: str) -> DataType:
        if column.endswith("__n"):
            return LongType()
        if column.endswith("__s"):
            return self._sum_type(node, ctx, agg)
        if column.endswith("__m"):
            return self._input_type(node, ctx, agg.arg)
        return ctx.memo(node, f"type:{agg.name}", lambda: ctx.snapshot(node.input, NEW).select(
            F.expr(sql(agg.expression))).schema[0].dataType)

    def _recompute(self, node: Aggregate, ctx, touched: DataFrame) -> DataFrame:
        """Fill MIN/MAX of groups touched by deletes, and non-invertible aggregates of every
        touched group, from `new` restricted to those groups."""
        needing = [a for a in node.aggs if _needs_recompute(a) and not a.distinct]
        if not needing:
            return touched
        keys = list(node.keys)
        condition = F.lit(any(a.func == "other" for a in needing))
        for agg in needing:
            if agg.func in ("min", "max"):
                condition = condition | (c(f"{agg.name}__neg") == 1)
        groups = touched.filter(condition).select(*[c(k) for k in keys])
        rows = restrict(ctx.snapshot(node.input, NEW), groups, keys)
        parts = []
        for agg in needing:
            if agg.func in ("min", "max"):
                fn = F.min if agg.func == "min" else F.max
                parts.append(fn(c(agg.arg)).alias(f"r__{agg.name}"))
            else:
                parts.append(F.expr(sql(agg.expression)).alias(f"r__{agg.name}"))
        if keys:
            recomputed = rows.groupBy(*[c(k) for k in keys]).agg(*parts)
            recomputed = recomputed.select(*[c(k).alias("r__k_" + k) for k in keys], *[c(f"r__{a.name}") for a in needing])
            touched = touched.join(recomputed, null_safe_on(touched, recomputed, [(k, "r__k_" + k) for k in keys]), "left")
        else:
            touched = touched.crossJoin(rows.agg(*parts))
        for agg in needing:
            column = state_columns_of(agg)[0]
            recomputed_value = c(f"r__{agg.name}")
            if agg.func in ("min", "max"):
                value = F.when(c(f"{agg.name}__neg") == 1, recomputed_value).otherwise(c("n__" + column))
            else:
                value = recomputed_value
            touched = touched.withColumn("n__" + column, value.cast(self._state_type(node, ctx, agg, column)))
        return touched.drop(*[f"r__{a.name}" for a in needing], *["r__k_" + k for k in keys])

    def delta(self, node: Aggregate, ctx) -> DataFrame:
        touched = self._touched(node, ctx)

        def change_of(frame: DataFrame) -> DataFrame:  # Spark's columns built only where Spark computes
            return self._change_of(node, ctx, frame)

        if held_exactly(touched):
            # left unconsolidated (a group whose visible row did not change cancels where the
            # step's change is consolidated, on the driver), which spares the shuffle
            rows = computed_rows(touched)
            if rows is not None:
                schema = self._change_schema(node, ctx, touched.schema) or analysed_schema(
                    ctx, ("aggregate change", self._described(node, ctx)), change_of, touched.schema)
                finalized = finalized_rows(node, rows, schema)
                if finalized is not None:  # computed in Arrow: a local relation, no Spark plan
                    return hold(ctx.reads.local(ctx.spark, finalized, schema), finalized, exact=True)
            change = change_of(touched)
            return hold(change, change.toArrow, exact=True)  # Spark's, collected if asked for
        return consolidate(change_of(touched))

    def _change_of(self, node: Aggregate, ctx, touched: DataFrame) -> DataFrame:
        """Per touched group, -finalize(old state) where it existed, +finalize(new state) where it exists."""
        keys, glob = list(node.keys), not node.keys
        existed = c("o__" + COUNT).isNotNull() & ((c("o__" + COUNT) > 0) | F.lit(glob))
        exists = (c("n__" + COUNT) > 0) | F.lit(glob)
        old_rows = touched.filter(existed).select(
            *[c(k) for k in keys], *self._finalize(node, ctx, "o__"), F.lit(-1).cast(LongType()).alias(WEIGHT)
        )
        new_rows = touched.filter(exists).select(
            *[c(k) for k in keys], *self._finalize(node, ctx, "n__"), F.lit(1).cast(LongType()).alias(WEIGHT)
        )
        return old_rows.unionByName(new_rows)

    def _change_schema(self, node: Aggregate, ctx, touched: StructType) -> StructType | None:
        """The schema of _change_of over touched groups of schema `touched`, as Spark's analysis
        gives it (_visible_schema of both states, the weight); None where a type is Spark's to say."""
        visible = self._visible_schema(node, ctx, touched, ("o__", "n__"))
        return StructType(visible.fields + [StructField(WEIGHT, LongType(), False)]) if visible is not None else None

    def _visible_schema(self, node: Aggregate, ctx, schema: StructType, prefixes: tuple[str, ...]) -> StructType | None:
        """The keys and _finalize's values over state columns named `prefix + state column` in
        `schema`, as Spark's analysis types them, from the types _finalize casts to (asking Spark
        costs a plan analysed over an empty relation: a new process's first epoch asked about a
        hundred times); a column read from several prefixes (a union of their rows) is nullable
        where one is. None where a type is Spark's to say. Held against Spark's analysis by
        tests/test_analysed_schemas.py."""
        def nullable(name: str) -> bool:
            return any(schema[prefix + name].nullable for prefix in prefixes)

        fields = [StructField(k, schema[k].dataType, schema[k].nullable) for k in node.keys]
        for agg in node.aggs:
            arg_type = self._input_type(node, ctx, agg.arg) if agg.func in ("sum", "avg") else None
            if agg.func in ("count_star", "count", "min", "max"):
                column = COUNT if agg.func == "count_star" else f"{agg.name}__n" if agg.func == "count" else f"{agg.name}__m"
                fields.append(StructField(agg.name, schema[prefixes[-1] + column].dataType, nullable(column)))
            elif agg.func == "sum" and sum_type(arg_type) is not None:
                fields.append(StructField(agg.name, self._sum_type(node, ctx, agg), True))
            elif agg.func == "avg" and isinstance(arg_type, (DecimalType, IntegralType, DoubleType, FloatType)):
                fields.append(StructField(agg.name, DecimalType(min(38, arg_type.precision + 4), min(38, arg_type.scale + 4))
                                          if isinstance(arg_type, DecimalType) else DoubleType(), True))
            else:
                return None
        return StructType(fields)

    def _described(self, node: Aggregate, ctx) -> tuple:
        """What the aggregate computes, as a key of the schemas analysed once (analysed_schema)."""
        return tuple(node.keys), tuple(a.describe() for a in node.aggs), self._input_schema(node, ctx).json()

    def held_snapshot(self, node: Aggregate, ctx, side: str, column: str | None = None, keys=None) -> DataFrame | None:
        """`snapshot` built on the driver, so the join terms and affected-key recomputes reading
        it as a partner (a scalar subquery, an aggregated view) may compute there: the state's
        latest rows read by delta-rs (every group when the state is small, else the groups whose
        `column`, a group key, is one of `keys`: (values, NULLs) or a function giving them), at
        the epoch's end with the touched groups' new state over them, finalized by Spark over a
        local relation and noted as Spark's rows (collected only if asked for). None where it
        is Spark's to read."""
        groups = list(node.keys)
        if ctx.rescan or ctx.reads is None or any(a.func == "other" for a in node.aggs) or \
                (column is not None and column not in groups):
            return None
        fresh = None
        if ctx.changed(node):
            touched = self._touched(node, ctx)  # the state advances whichever side is read
            if side == NEW:
                fresh = computed_rows(touched)
                if fresh is None:
                    return None
        wanted = (keys() if callable(keys) else keys) if column is not None else None
        if column is not None and wanted is None:
            return None
        state = ctx.state.latest_table_on_driver(ctx.state_name(node), groups, column, wanted)
        if state is None:
            return None
        columns = [COUNT] + [s for a in node.aggs for s in state_columns_of(a)]
        schema = StructType([StructField(k, self._input_type(node, ctx, k)) for k in groups] +
                            [StructField(s, LongType() if s == COUNT else self._state_type(node, ctx, agg, s))
                             for agg, s in [(None, COUNT)] + [(a, s) for a in node.aggs for s in state_columns_of(a)]])
        state = spark_typed(state, schema)
        if state is None:
            return None
        if fresh is not None:
            state = state.filter(pa.array(~keys_in(state, groups, fresh, groups))) \
                if groups else state.slice(0, 0)  # a global aggregate's one row is always touched
            exists = pc.greater(fresh.column("n__" + COUNT), 0) if groups else pa.array([True] * fresh.num_rows, pa.bool_())
            new = fresh.filter(exists).select([*groups, *["n__" + s for s in columns]]).rename_columns(schema.names)
            state = pa.concat_tables([state, new.cast(state.schema)])
        state = state.combine_chunks()
        finalize = lambda frame: frame.select(*[c(k) for k in groups], *self._finalize(node, ctx, ""))  # noqa: E731
        visible = self._visible_schema(node, ctx, schema, ("",)) or \
            analysed_schema(ctx, ("aggregate snapshot", self._described(node, ctx)), finalize, schema)
        rows = finalized_state(node, state, visible)
        if rows is not None:  # computed in Arrow: Spark plans it only if an operator above needs it
            return hold(lazy_frame(ctx.spark, lambda: finalize(ctx.reads.local(ctx.spark, state, schema)), visible),
                        rows, exact=True)
        finalized = finalize(ctx.reads.local(ctx.spark, state, schema))
        return hold(finalized, finalized.toArrow, exact=True)

    def snapshot(self, node: Aggregate, ctx, side: str) -> DataFrame:
        keys = list(node.keys)
        held = self.held_snapshot(node, ctx, side)
        if held is not None:
            return held
        if ctx.rescan:
            state = self._full_state(node, ctx, side)
        elif side == OLD or not ctx.changed(node):
            if ctx.changed(node):
                self._touched(node, ctx)  # the state must advance even if only the old side is read
            state = ctx.state.read(ctx.state_name(node), keys)
        else:
            old = ctx.state.read(ctx.state_name(node), keys)
            touched = self._touched(node, ctx)
            state_columns = [COUNT] + [s for a in node.aggs for s in state_columns_of(a)]
            fresh = touched.filter((c("n__" + COUNT) > 0) | F.lit(not keys)).select(
                *[c(k) for k in keys], *[c("n__" + s).alias(s) for s in state_columns]
            )
            state = self._untouched(old, touched, keys).unionByName(fresh) if keys else fresh
        return state.select(*[c(k) for k in keys], *self._finalize(node, ctx, ""))

    def _untouched(self, old: DataFrame, touched: DataFrame, keys: list[str]) -> DataFrame:
        """Old state rows of the groups this epoch did not touch."""
        renamed = touched.select(*[c(k).alias("t__" + k) for k in keys])
        return old.join(renamed, null_safe_on(old, renamed, [(k, "t__" + k) for k in keys]), "left_anti")
