"""Optimizer passes (docs/architecture.md, section 4): each pass on small graphs, the pass list as
the engine applies it, and, on real Spark and Delta, that the optimized and the unoptimized (naive)
plans of the differential suite's definitions give identical tables over random epochs."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from sqlglot import exp, parse_one

from epochal import Engine
from epochal.graph import AggCall, Aggregate, Filter, Join, OuterJoin, Project, Scan, UnionAll, Window, col, render
from epochal.planning.compile import compile_definition
from epochal.planning.optimize import PASSES, optimize, passes_named
from epochal.planning.optimize.drop_passthrough import drop_passthrough
from epochal.planning.optimize.flatten_joins import flatten_joins
from epochal.planning.optimize.fold_constants import fold_constants
from epochal.planning.optimize.fuse import fuse_filters, fuse_projections
from epochal.planning.optimize.fuse_windows import fuse_windows
from epochal.planning.optimize.prune_columns import prune_columns
from epochal.planning.optimize.push_predicates import push_predicates
from epochal.planning.optimize.restrict_cogenerators import restrict_cogenerators
from epochal.planning.plan import TableInfo
from tests.support import SyntheticSource, assert_matches_recompute, stored_rows
from tests.test_differential import A_INITIAL, A_SCHEMA, B_INITIAL, B_SCHEMA, DEFINITIONS, apply_a, apply_b, epoch_lists


def scan(table: str, *columns: str, predicate=None) -> Scan:
    return Scan(columns=tuple(f"{table}_{c}" for c in columns), table=table, fields=columns, predicate=predicate)


def p(text: str) -> exp.Expression:
    """An expression over internal column names (quoted, as the planner writes them)."""
    return parse_one(text, read="spark").transform(
        lambda n: col(n.name) if isinstance(n, exp.Column) else n)


A = scan("a", "k", "g", "v")
B = scan("b", "k", "name")


# ---- one pass at a time ------------------------------------------------------------------------
def test_drop_passthrough_removes_identity_projections_and_single_unions_only():
    identity = Project(columns=A.columns, input=A, exprs=tuple(col(c) for c in A.columns))
    assert drop_passthrough(identity) is A
    assert drop_passthrough(UnionAll(columns=A.columns, parts=(A,))) is A
    renaming = Project(columns=("x",), input=A, exprs=(col("a_k"),))
    assert drop_passthrough(renaming) is renaming
    reordering = Project(columns=("a_g", "a_k", "a_v"), input=A, exprs=(col("a_g"), col("a_k"), col("a_v")))
    assert drop_passthrough(reordering) is reordering


def test_fuse_filters_makes_one_conjunction():
    fused = fuse_filters(Filter(columns=A.columns, input=Filter(columns=A.columns, input=A, predicate=p("a_v > 1")),
                                predicate=p("a_g = 'x'")))
    assert isinstance(fused, Filter) and fused.input is A
    assert fused.describe() == "`a_v` > 1 AND `a_g` = 'x'"


def test_fuse_projections_substitutes_and_keeps_shared_projections():
    inner = Project(columns=("x",), input=A, exprs=(p("a_v + 1"),))
    fused = fuse_projections(Project(columns=("y",), input=inner, exprs=(p("x * 2"),)))
    assert fused.input is A and fused.describe() == "(`a_v` + 1) * 2 AS y"
    shared = Join(columns=("y", "z"), parts=(
        Project(columns=("y",), input=inner, exprs=(col("x"),)),
        Project(columns=("z",), input=inner, exprs=(col("x"),))))
    assert all(part.input is inner for part in fuse_projections(shared).parts)  # read twice: kept


def test_fuse_windows_joins_one_partitioning_unless_the_outer_reads_the_inner():
    inner = Window(columns=(*A.columns, "rn"), input=A, partition=("a_g",),
                   functions=(p("row_number() OVER (PARTITION BY a_g ORDER BY a_v)"),))
    outer = Window(columns=(*inner.columns, "s"), input=inner, partition=("a_g",),
                   functions=(p("sum(a_v) OVER (PARTITION BY a_g)"),))
    fused = fuse_windows(outer)
    assert isinstance(fused, Window) and fused.input is A and fused.columns == outer.columns
    assert len(fused.functions) == 2
    reading = Window(columns=(*inner.columns, "s"), input=inner, partition=("a_g",),
                     functions=(p("sum(rn) OVER (PARTITION BY a_g)"),))
    assert fuse_windows(reading) is reading
    other = Window(columns=(*inner.columns, "s"), input=inner, partition=("a_k",),
                   functions=(p("sum(a_v) OVER (PARTITION BY a_k)"),))
    assert fuse_windows(other) is other


def test_push_predicates_into_join_inputs_scans_and_below_group_keys():
    join = Join(columns=A.columns + B.columns, parts=(A, B), condition=p("a_k = b_k"))
    pushed = push_predicates(Filter(columns=join.columns, input=join, predicate=p("a_v > 1 AND b_name = 'n' AND a_v < b_k")))
    assert isinstance(pushed, Join)
    assert [part.describe() for part in pushed.parts] == [
        "source a [k, g, v] where `a_v` > 1", "source b [k, name] where `b_name` = 'n'"]
    assert pushed.describe() == "2 inputs on `a_k` = `b_k` AND `a_v` < `b_k`"

    aggregate = Aggregate(columns=("a_g", "s"), input=A, keys=("a_g",), aggs=(AggCall("s", "sum", "a_v"),))
    having = push_predicates(Filter(columns=aggregate.columns, input=aggregate, predicate=p("a_g = 'x' AND s > 3")))
    assert isinstance(having, Filter) and having.describe() == "`s` > 3"  # an aggregate stays above
    assert having.input.input.describe() == "source a [k, g, v] where `a_g` = 'x'"


def test_push_predicates_respects_outer_joins():
    outer = OuterJoin(columns=A.columns + B.columns, left=A, right=B, side="left", pairs=(("a_k", "b_k"),))
    pushed = push_predicates(Filter(columns=outer.columns, input=outer, predicate=p("a_v > 1 AND b_name IS NULL")))
    # the preserved side's filter moves below; the null-supplying side's must stay above
    assert isinstance(pushed, Filter) and pushed.describe() == "`b_name` IS NULL"
    assert pushed.input.left.describe() == "source a [k, g, v] where `a_v` > 1"
    assert pushed.input.right is B


def test_prune_columns_reads_only_what_is_used():
    aggregate = Aggregate(columns=("a_g", "s", "m"), input=A, keys=("a_g",),
                          aggs=(AggCall("s", "sum", "a_v"), AggCall("m", "max", "a_k")))
    pruned = prune_columns(Project(columns=("a_g", "s"), input=aggregate, exprs=(col("a_g"), col("s"))))
    assert pruned.input.describe() == "by a_g: sum(a_v) AS s"  # max(k) is not read
    assert pruned.input.input.describe() == "source a [g, v]"


def test_fold_constants_folds_and_drops_true_filters():
    filtered = Filter(columns=A.columns, input=A, predicate=p("1 = 1"))
    assert fold_constants(filtered) is A
    dated = fold_constants(Filter(columns=A.columns, input=A,
                                  predicate=p("a_g < DATE '1994-01-01' + INTERVAL '1' YEAR")))
    assert dated.describe() == "`a_g` < CAST('1995-01-01' AS DATE)"
    projected = fold_constants(Project(columns=("x",), input=A, exprs=(p("a_v + (2 * 3)"),)))
    assert projected.describe() == "`a_v` + 6 AS x"


def test_flatten_joins_makes_one_n_ary_join():
    c = scan("c", "k")
    inner = Join(columns=A.columns + B.columns, parts=(A, B), condition=p("a_k = b_k"))
    flat = flatten_joins(Join(columns=inner.columns + c.columns, parts=(inner, c), condition=p("b_k = c_k")))
    assert flat.parts == (A, B, c)
    assert flat.describe() == "3 inputs on `a_k` = `b_k` AND `b_k` = `c_k`"


def test_restrict_cogenerators_marks_equalities_between_scans():
    filtered_b = Filter(columns=B.columns, input=B, predicate=p("b_name <> 'x'"))
    renamed_b = Project(columns=("bk", "bn"), input=filtered_b, exprs=(col("b_k"), col("b_name")))
    join = Join(columns=A.columns + renamed_b.columns, parts=(A, renamed_b), condition=p("a_k = bk AND a_v > bk"))
    marked = restrict_cogenerators(join)
    assert marked.restrict == ((0, "a_k", 1, "bk"), (1, "bk", 0, "a_k"))
    assert "d1.a_k -> 2.bk, d2.bk -> 1.a_k" in render(marked)
    # NULL-safe equality (NULL keys match) and computed columns are not restricted
    assert restrict_cogenerators(join.replace(condition=p("a_k <=> bk"))).restrict == ()
    computed = Project(columns=("bk",), input=B, exprs=(p("b_k + 1"),))
    assert restrict_cogenerators(Join(columns=A.columns + ("bk",), parts=(A, computed),
                                      condition=p("a_k = bk"))).restrict == ()
    # an aggregate's snapshot comes from state, not a scan: it is not restricted, but it may restrict
    aggregate = Aggregate(columns=("b_k", "n"), input=B, keys=("b_k",), aggs=(AggCall("n", "count_star"),))
    assert restrict_cogenerators(Join(columns=A.columns + aggregate.columns, parts=(A, aggregate),
                                      condition=p("a_k = b_k"))).restrict == ()


# ---- the pass list -----------------------------------------------------------------------------
SCHEMAS = {"a": {"k": "int", "g": "string", "v": "int", "d": "decimal(10,2)"},
           "b": {"k": "int", "name": "string", "w": "double"}}
TABLES = {name: TableInfo("source", tuple(columns)) for name, columns in SCHEMAS.items()}


def test_optimize_rewrites_a_query_into_a_lean_plan_and_reports_the_passes():
    compiled = compile_definition(
        "t", "SELECT x.k, x.name FROM (SELECT a.k, b.name, a.v FROM a JOIN b ON a.k = b.k) x "
             "WHERE x.v > 1 + 1 AND x.name IS NOT NULL", TABLES, SCHEMAS)
    assert render(compiled.plan) == (
        "#1 Project `k` AS k_4, `name` AS name_3\n"
        "  #2 Join 2 inputs on `k` = `k_2`; co-generators read for the change's keys: d1.k -> 2.k_2, d2.k_2 -> 1.k\n"
        "    #3 Scan source a [k, v] where `v` > 2\n"
        "    #4 Scan source b [k, name] where NOT `name` IS NULL")
    assert set(compiled.passes) >= {"fold_constants", "push_predicates", "fuse_projections", "prune_columns",
                                    "restrict_cogenerators"}
    naive = compile_definition("t", compiled.sql, TABLES, SCHEMAS, rewrites=())
    assert render(naive.plan) == render(naive.naive) and naive.passes == ()
    assert naive.fingerprint == compiled.fingerprint  # the SQL is the same; only the plan differs


def test_passes_are_named_and_idempotent():
    assert passes_named(None) == PASSES
    assert passes_named(["prune_columns", "flatten_joins"]) == (flatten_joins, prune_columns)
    with pytest.raises(ValueError, match="unknown optimizer pass"):
        passes_named(["no_such_pass"])
    compiled = compile_definition("t", DEFINITIONS["joined_agg"], TABLES, SCHEMAS)
    again, changed = optimize(compiled.plan)
    assert render(again) == render(compiled.plan) and changed == ()


# ---- optimized and naive plans agree on real data -------------------------------------------------
COMPARED = {name: DEFINITIONS[name] for name in ("joined", "joined_agg", "by_group", "pairs", "both", "keyed", "keyed_sum")}


@pytest.mark.long  # a differential run of both plans; make test-long
@settings(max_examples=1, deadline=None, suppress_health_check=list(__import__("hypothesis").HealthCheck))
@given(epochs=epoch_lists(min_size=3, max_size=3))  # one example: a random one, not the simplest (no change)
def test_optimized_and_naive_plans_give_identical_tables(spark, warehouse, epochs):
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", A_SCHEMA, A_INITIAL)
    b = SyntheticSource(spark, f"{root}/sources/b", B_SCHEMA, B_INITIAL)
    engines = {}
    for label, passes in (("optimized", None), ("naive", ())):
        engine = Engine(spark, f"{root}/{label}", passes=passes, cost_model=False)
        engine.source("a", path=a.path)
        engine.source("b", path=b.path)
        engine.define_all(COMPARED)
        engines[label] = engine
    for number, (a_ops, b_ops) in enumerate([([], [])] + epochs, start=1):
        for op in a_ops:
            apply_a(a, op)
        for op in b_ops:
            apply_b(b, op)
        for label, engine in engines.items():
            reports = engine.refresh()
            if number > 1:
                assert all(r.technique in ("incremental", "noop") for r in reports), (label, reports)
        context = f"after epoch {number}: a {a_ops} b {b_ops}"
        for name in COMPARED:
            assert stored_rows(engines["optimized"], name) == stored_rows(engines["naive"], name), f"{name} {context}"
        assert_matches_recompute(engines["optimized"], COMPARED, context)
