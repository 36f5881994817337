"""Scan: a source or derived Delta table. Its change batch is the change data feed of the versions
the epoch covers, restricted to the columns and rows the plan reads, consolidated; its snapshots
are time-travel reads. A small change batch or snapshot is read once per refresh, on the driver, and
shared by every step reading it (shared_reads.py); such a batch is consolidated there too, so its
rows are counted, and its key values taken, without a Spark job, after its predicate where Arrow
decides that as Spark does (driver/filters.py; filtering and consolidating commute). Rows that
passed a predicate Arrow decided are carried as exactly the scan's rows (arrow_rows.hold), so the
join terms and aggregates above may compute on them there. No state: Delta keeps every version
(co-generators, as "How Pulley Produces Incremental Output" calls them)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, IntegralType, LongType, StructField, StructType

from ..arrow_rows import KEY_TYPES, hold
from ..changes import NEW, consolidate, quoted, read_changes, read_snapshot
from ..driver.filters import driver_filter
from ..graph import WEIGHT, Scan
from ..narrowing import MAX_KEYS
from .base import Rule, expr


class ScanRule(Rule):
    operator = Scan
    rule = "d = change data feed of the covered versions (weights +1/-1), consolidated"

    def _shape(self, node: Scan, frame: DataFrame, weighted: bool) -> DataFrame:
        columns = [F.col(quoted(f)).alias(c) for f, c in zip(node.fields, node.columns)]
        shaped = frame.select(*columns, *([F.col(WEIGHT)] if weighted else []))
        return shaped.filter(expr(node.predicate)) if node.predicate is not None else shaped

    def _held_frame(self, node: Scan, ctx, rows, schema, weighted: bool) -> DataFrame:
        """`_shape` of the scan's rows as a local relation of Arrow `rows` that passed the
        predicate on the driver (columns named as the scan's): Spark receives them only if a
        rule hands them on (arrow_rows.LocalFrame), where `_shape` over the read's frame
        would hand the whole read to Spark at once."""
        fields = {f.name.lower(): f for f in schema.fields}
        shape = [StructField(c, fields[f.lower()].dataType, fields[f.lower()].nullable)
                 for f, c in zip(node.fields, node.columns)]
        if weighted:
            shape.append(StructField(WEIGHT, LongType()))
        return hold(ctx.reads.local(ctx.spark, rows, StructType(shape)), rows, exact=True)

    def delta(self, node: Scan, ctx) -> DataFrame:
        source = ctx.inputs[node.table]
        consolidated = ctx.reads.consolidated_changes(ctx.spark, source.path, source.before, source.after,
                                                      source.schema, list(node.fields)) \
            if ctx.reads is not None else None
        if consolidated is not None:  # read once per refresh and consolidated on the driver: no job
            frame, rows = consolidated
            ctx.meter.note_read("shared changes", node.table, (source.before, source.after))
            rows = rows.rename_columns([*node.columns, WEIGHT])
            passing = driver_filter(rows, node.predicate)
            if passing is not None:
                return self._held_frame(node, ctx, passing, source.schema, True)
            return hold(self._shape(node, frame, True), rows)
        shared = ctx.reads.changes(ctx.spark, source.path, source.before, source.after, source.schema,
                                   list(node.fields)) if ctx.reads is not None else None
        ctx.meter.note_read("changes" if shared is None else "shared changes", node.table, (source.before, source.after))
        changes = shared if shared is not None else read_changes(
            ctx.spark, source.path, source.before, source.after, list(node.fields))
        return consolidate(self._shape(node, changes, True))

    def snapshot(self, node: Scan, ctx, side: str) -> DataFrame:
        source = ctx.inputs[node.table]
        version = source.version(side)
        shared = ctx.reads.snapshot(ctx.spark, source.path, version, source.schema) \
            if ctx.reads is not None and version >= 0 else None
        ctx.meter.note_read("version" if shared is None else "shared version", node.table, version)
        if shared is None:
            return self._shape(node, read_snapshot(ctx.spark, source.path, version, source.schema), False)
        held = self.held_read(node, ctx, ctx.reads.snapshot_rows(source.path, version), shared, source.schema)
        return held if held is not None else self._shape(node, shared, False)

    def held_read(self, node: Scan, ctx, data, frame: DataFrame, schema) -> DataFrame | None:
        """The scan over a read held on the driver (Arrow `data` with the table's column names,
        `frame` the same rows as a local relation): exactly its rows where Arrow decides the
        predicate, else Spark's `_shape` of `frame` noted as held (a superset, for keys); None
        where `data` lacks a column the scan reads."""
        names = {c.lower(): c for c in data.column_names}
        if any(f.lower() not in names for f in node.fields):
            return None
        rows = data.select([names[f.lower()] for f in node.fields]).rename_columns(list(node.columns))
        passing = driver_filter(rows, node.predicate)
        if passing is not None:
            return self._held_frame(node, ctx, passing, schema, False)
        return hold(self._shape(node, frame, False), rows)

    def held_snapshot(self, node: Scan, ctx, side, column, keys):
        """The version's rows whose `column` is one of the keys, read on the driver once per
        refresh for every step asking (SharedReads.keys_frame_and_rows), through `held_read`:
        filtered there, so fewer keys go onward; None for a key type Arrow and Spark may not
        compare alike (floating point: -0.0 and NaN; timestamps: time zones), or too many keys."""
        def read(source, version, field):
            wanted = keys() if callable(keys) else keys
            if wanted is None or len(wanted[0]) > MAX_KEYS:
                return None
            values, nulls = wanted
            return ctx.memo(node, ("restricted", version, field, values, nulls), lambda: ctx.reads.keys_frame_and_rows(
                ctx.spark, source.path, version, source.schema, field, values, nulls))

        return self._held_part(node, ctx, side, column, KEY_TYPES, read)

    def expected_rows(self, node: Scan, ctx, side, column, keys):
        """SharedReads.expected_key_rows for the version `held_snapshot` would read."""
        if column not in node.columns or keys is None or len(keys[0]) > MAX_KEYS:
            return None
        source = ctx.inputs[node.table]
        version = source.version(side if ctx.changed(node) else NEW)
        if version < 0:
            return None
        field = node.fields[node.columns.index(column)]
        return ctx.reads.expected_key_rows(source.path, version, field, keys[0], keys[1])

    def held_range(self, node: Scan, ctx, side, column, low, high):
        """The version's rows whose `column` lies in [low, high], read on the driver once per
        refresh (SharedReads.range_frame_and_rows), through `held_read`; None for a column not an
        integer, decimal or date, or too many rows."""
        def read(source, version, field):
            return ctx.memo(node, ("range", version, field, low, high), lambda: ctx.reads.range_frame_and_rows(
                ctx.spark, source.path, version, source.schema, field, low, high))

        return self._held_part(node, ctx, side, column, (IntegralType, DecimalType, DateType), read)

    def _held_part(self, node: Scan, ctx, side, column, kinds: tuple, read):
        """Some of the version's rows, `read(source, version, field)` (a local relation and its
        Arrow rows, or None) where `column`'s type is one of `kinds`, through `held_read`."""
        if column not in node.columns:
            return None
        source = ctx.inputs[node.table]
        version = source.version(side if ctx.changed(node) else NEW)
        field = node.fields[node.columns.index(column)]
        types = {f.name.lower(): f.dataType for f in source.schema.fields}
        if version < 0 or not isinstance(types.get(field.lower()), kinds):
            return None
        found = read(source, version, field)
        if found is None:
            return None
        frame, data = found
        held = self.held_read(node, ctx, data, frame, source.schema)
        if held is not None:
            ctx.meter.note_read("restricted version", node.table, version)
        return held
