"""Inner join of n inputs on a conjunctive condition.

d(R1 ⋈ ... ⋈ Rn) = Σ_i new_1 ⋈ ... ⋈ new_(i-1) ⋈ dR_i ⋈ old_(i+1) ⋈ ... ⋈ old_n

Each term starts from the change batch of one input and joins the others in an order that follows
the join condition outward from it, so every join has an equality to the rows already collected
(semi-join reduction: only partners of changed rows are kept). Terms of unchanged inputs vanish
without a Spark job. The other inputs are read by Delta time travel, so no state is kept. A term
whose inputs are all held exactly on the driver (the batch and its partners read there) is joined
there, in Arrow (driver/joins.py), and reaches Spark as a local relation.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..arrow_rows import exact_rows, hold, spark_typed
from ..changes import NEW, OLD, quoted
from ..driver.joins import join_rows, output_schema
from ..graph import WEIGHT, Join, conjoin, join_order
from ..narrowing import dropped_scalars, narrow_partners, restricted_snapshot, scalar_spans
from .base import Rule, expr, union_all

log = logging.getLogger("epochal")


def join_frames(node: Join, frames: dict[int, DataFrame], start: int) -> DataFrame:
    joined = frames[start]
    for index, applicable in join_order(node, start):
        condition = expr(conjoin(applicable)) if applicable else None
        if index < 0:
            joined = joined.filter(condition)
        elif condition is None:
            joined = joined.crossJoin(frames[index])
        else:
            joined = joined.join(frames[index], on=condition, how="inner")
    weight = [F.col(WEIGHT)] if WEIGHT in frames[start].columns else []
    return joined.select(*[F.col(quoted(c)) for c in node.columns], *weight)


def join_on_driver(node: Join, ctx, frames: dict[int, DataFrame], start: int):
    """The term's rows and Spark schema, joined in Arrow (driver/joins.py) where every input is
    held exactly on the driver; None where it is Spark's to join."""
    held = {j: exact_rows(frame) for j, frame in frames.items()}
    if any(rows is None for rows in held.values()):
        log.debug("join term d%d joined by Spark: inputs not held exactly on the driver: %s", start + 1,
                  "; ".join(f"{j + 1}: {node.parts[j].kind} {node.parts[j].describe()}"
                            for j, rows in held.items() if rows is None))
        return None
    schemas = {j: frame.schema for j, frame in frames.items()}
    typed = {j: spark_typed(held[j], schemas[j]) for j in frames}
    if any(rows is None for rows in typed.values()):
        return None
    rows = join_rows(node, typed, schemas, start)
    if rows is None:
        log.debug("join term d%d joined by Spark: Arrow does not decide %s as Spark does", start + 1,
                  node.describe())
    return None if rows is None else (rows, output_schema(node, schemas, start))


class JoinRule(Rule):
    operator = Join
    materialize_delta = True
    rule = "Σ_i new_1..new_(i-1) ⋈ d_i ⋈ old_(i+1)..old_n, each term joined outward from d_i"
    state = "none (other inputs read by Delta time travel)"

    def delta(self, node: Join, ctx):
        terms, on_driver = [], []
        for i, part in enumerate(node.parts):
            change = ctx.delta(part)
            if change is None:
                continue
            sides = {j: NEW if j < i else OLD for j in range(len(node.parts)) if j != i}
            marked = [(a, j, b) for start, a, j, b in node.restrict if start == i]  # co-generators read for d_i's keys only
            spans = scalar_spans(node, i, change) if i in dropped_scalars(ctx, node) else None
            frames = narrow_partners(ctx, node, i, {i: change}, sides, marked, held_only=True, spans=spans)
            joined = join_on_driver(node, ctx, frames, i)
            if joined is not None:
                on_driver.append(joined)
            else:
                terms.append(join_frames(node, frames, i))
        if on_driver:
            rows, schema = pa.concat_tables([rows.cast(on_driver[0][0].schema) for rows, _ in on_driver]), on_driver[0][1]
            terms.insert(0, hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True))
        return union_all(terms)

    def snapshot(self, node: Join, ctx, side):
        frames = {i: ctx.snapshot(part, side) for i, part in enumerate(node.parts)}
        return join_frames(node, frames, 0)

    def held_snapshot(self, node: Join, ctx, side: str, column: str, keys):
        """The rows whose `column` is one of the keys (narrowing.restricted_snapshot): the input
        holding `column` read for the keys, then each further input, in the join's order, for the
        values its equality to the inputs read so far can match (semi-join reduction, on the
        driver), or in full where it cannot be; None where the first input cannot be."""
        owner = next((p for p, part in enumerate(node.parts) if column in part.columns), None)
        start = restricted_snapshot(ctx, node.parts[owner], side, column, keys) if owner is not None else None
        if start is None:
            return None
        frames = {owner: start}
        narrow_partners(ctx, node, owner, frames, {j: side for j in range(len(node.parts)) if j != owner})
        joined = join_on_driver(node, ctx, frames, owner)
        if joined is not None:  # every input held exactly: joined in Arrow
            rows, schema = joined
            return hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True)
        return join_frames(node, frames, owner)
