"""The derived tables as declared: one `assets/sql/<name>.sql` each, with an optional sidecar
`<name>.yml`. Loading them needs no Spark: sqlglot reads the tables a query refers to (the same
parse the engine's compiler starts with), so the Dagster code location loads in a second and the
lineage is the SQL's own.

A sidecar holds everything about a table that is not its query:

    description: Revenue lost to returned parts, per customer.   # shown in the UI
    key: [c_custkey]            # the output's unique key: checked by a blocking `key_is_unique` check
    partitioning: hourly        # hourly (default) or daily epochs
    partition_start: 2026-01-01T00:00:00Z   # first partition (default: where the warehouse's
                                            # sources start, else PARTITION_START)
    strict: false               # true: fail instead of rescanning (except the first run)
    group: derived              # Dagster asset group
    expectations:               # great-expectations 1.x, run as blocking asset checks
      - expect_column_values_to_not_be_null: {column: c_custkey}
      - type: expect_column_values_to_be_between
        kwargs: {column: revenue, min_value: 0}
        name: revenue_not_negative           # optional check name
        scope: rows                          # optional: rows | table

Row-level expectations (a value per row: not null, between, in set, regex, ...) validate only the
rows each epoch inserted; table-level ones (uniqueness, row counts, aggregates) validate the whole
table. `scope` overrides the classification.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from epochal.errors import DefinitionError
from epochal.planning.compile import parse, referenced_tables
from epochal.storage.clock import utc
from epochal.storage.warehouse import InvalidName, check_name

SQL_FOLDER = Path(__file__).resolve().parent / "sql"
# Where partitions start when neither a sidecar nor the warehouse says (a warehouse whose sources
# are not loaded yet); with sources, partitions start at the logical time of their first commit.
PARTITION_START = datetime(2026, 1, 1, tzinfo=timezone.utc)
CADENCES = ("hourly", "daily")
KEY_CHECK = "key_is_unique"

# Expectations that judge each row on its own: valid on the rows an epoch inserted. Everything
# else (uniqueness, row counts, aggregates, ordering, schema) needs the whole table.
ROW_LEVEL = frozenset(
    {
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_null",
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_not_be_in_set",
        "expect_column_values_to_match_regex",
        "expect_column_values_to_not_match_regex",
        "expect_column_values_to_match_regex_list",
        "expect_column_values_to_not_match_regex_list",
        "expect_column_values_to_match_like_pattern",
        "expect_column_values_to_not_match_like_pattern",
        "expect_column_values_to_match_like_pattern_list",
        "expect_column_values_to_not_match_like_pattern_list",
        "expect_column_value_lengths_to_be_between",
        "expect_column_value_lengths_to_equal",
        "expect_column_values_to_match_strftime_format",
        "expect_column_values_to_be_dateutil_parseable",
        "expect_column_values_to_be_json_parseable",
        "expect_column_pair_values_to_be_equal",
        "expect_column_pair_values_a_to_be_greater_than_b",
        "expect_column_pair_values_to_be_in_set",
        "expect_multicolumn_sum_to_equal",
        "expect_select_column_values_to_be_unique_within_record",
    }
)
_SHORTEN = ("column_values_to_", "column_pair_values_", "compound_columns_to_", "column_", "table_")


class SpecError(ValueError):
    """A SQL file or sidecar that cannot be turned into a derived table; the message names the
    file, what is wrong and the fix."""


@dataclass(frozen=True)
class ExpectationSpec:
    """One great-expectations expectation, run as one blocking Dagster asset check."""

    type: str
    kwargs: Mapping[str, Any]
    name: str
    scope: Literal["rows", "table"]

    @property
    def columns(self) -> list[str]:
        if "column" in self.kwargs:
            return [str(self.kwargs["column"])]
        if "column_list" in self.kwargs:
            return [str(c) for c in self.kwargs["column_list"]]
        return [str(self.kwargs[k]) for k in ("column_A", "column_B") if k in self.kwargs]

    def describe(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        where = "each epoch's inserted rows" if self.scope == "rows" else "the whole table"
        return f"{self.type}({arguments}) on {where} (great-expectations)"


@dataclass(frozen=True)
class TableSpec:
    """A derived table: its SQL, the tables it reads, and its sidecar settings."""

    name: str
    sql: str
    sql_path: Path
    inputs: tuple[str, ...]
    description: str | None = None
    key: tuple[str, ...] | None = None
    partitioning: str = "hourly"
    partition_start: datetime = PARTITION_START
    strict: bool = False
    group: str = "derived"
    expectations: tuple[ExpectationSpec, ...] = field(default_factory=tuple)
    sidecar_path: Path | None = None

    @property
    def sql_sha(self) -> str:
        """Identifies the SQL text (Dagster code version; the cached explain's key)."""
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    @property
    def row_expectations(self) -> tuple[ExpectationSpec, ...]:
        return tuple(e for e in self.expectations if e.scope == "rows")

    @property
    def table_expectations(self) -> tuple[ExpectationSpec, ...]:
        return tuple(e for e in self.expectations if e.scope == "table")


class _Sidecar(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str | None = None
    key: list[str] | None = None
    partitioning: Literal["hourly", "daily"] = "hourly"
    partition_start: datetime | None = None
    strict: bool = False
    group: str = "derived"
    expectations: list[dict[str, Any]] = []


def _expectation(path: Path, position: int, entry: dict[str, Any]) -> ExpectationSpec:
    where = f"{path}: expectation {position}"
    if "type" in entry:
        unknown = set(entry) - {"type", "kwargs", "name", "scope"}
        if unknown:
            raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
                            "use type, kwargs, name and scope")
        kind, kwargs = entry["type"], entry.get("kwargs") or {}
        name, scope = entry.get("name"), entry.get("scope")
    elif len(entry) == 1:
        [(kind, kwargs)] = entry.items()
        kwargs, name, scope = kwargs or {}, None, None
    else:
        raise SpecError(f"{where}: write either `- expect_...: {{kwargs}}` or `- type: expect_...` "
                        f"with kwargs, not {sorted(entry)}")
    if not isinstance(kind, str) or not kind.startswith("expect_"):
        raise SpecError(f"{where}: {kind!r} is not a great-expectations expectation type "
                        "(they start with expect_, e.g. expect_column_values_to_not_be_null)")
    if not isinstance(kwargs, dict):
        raise SpecError(f"{where}: the arguments of {kind} must be a mapping, e.g. {{column: x}}")
    if scope is None:
        scope = "rows" if kind in ROW_LEVEL else "table"
    if scope not in ("rows", "table"):
        raise SpecError(f"{where}: scope must be rows or table, not {scope!r}")
    spec = ExpectationSpec(kind, dict(kwargs), "", scope)
    if name is None:
        short = kind[len("expect_"):]
        for prefix in _SHORTEN:
            if short.startswith(prefix):
                short = short[len(prefix):]
                break
        short = re.sub(r"(^|_)(to_)?be_", r"\1", short)  # not_be_null -> not_null, be_in_set -> in_set
        name = "_".join(part for part in ("_".join(spec.columns), short) if part)
        name = re.sub(r"[^A-Za-z0-9_]+", "_", name)
    if not re.fullmatch(r"[A-Za-z0-9_]+", str(name)):
        raise SpecError(f"{where}: check name {name!r} may hold only letters, digits and underscores")
    return ExpectationSpec(kind, dict(kwargs), str(name), scope)


def _read_sidecar(path: Path) -> _Sidecar:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of settings (description, key, partitioning, "
                        "partition_start, strict, group, expectations)")
    try:
        return _Sidecar(**raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in error.errors())
        raise SpecError(f"{path}: {problems}. Known settings: description, key, partitioning "
                        "(hourly|daily), partition_start, strict, group, expectations") from None


def _inputs(name: str, sql: str, known: dict[str, str]) -> tuple[str, ...]:
    """The tables the query reads, by their declared names (the engine resolves them the same way)."""
    found: list[str] = []
    for table in referenced_tables(parse(name, sql)):
        real = known.get(table.name.lower())
        if real is None:
            meta = table.this.meta or {}
            raise DefinitionError(
                name, f"unknown table {table.name!r}", construct=table.name,
                line=meta.get("line"), column=meta.get("col"),
                fix="Add assets/sql/<name>.sql for a derived table, or a source asset; known: "
                + ", ".join(sorted(known.values())),
            )
        if real == name:
            raise DefinitionError(name, "a table cannot read itself", construct=table.name)
        if real not in found:
            found.append(real)
    return tuple(found)


def load_specs(folder: Path | str = SQL_FOLDER, sources: tuple[str, ...] | list[str] = (),
               default_start: datetime = PARTITION_START) -> dict[str, TableSpec]:
    """Every `<name>.sql` in `folder` with its sidecar, in dependency order (a table after the
    tables it reads). `sources` are the source tables the queries may read besides each other;
    a table without a `partition_start` starts at `default_start` (down to its hour or day)."""
    folder = Path(folder)
    sql_files = sorted(folder.glob("*.sql"))
    names = {}
    for path in sql_files:
        try:
            names[path.stem.lower()] = check_name(path.stem)
        except InvalidName as error:
            raise SpecError(f"{path}: {error}") from None
    for sidecar in sorted(folder.glob("*.yml")) + sorted(folder.glob("*.yaml")):
        if sidecar.stem.lower() not in names:
            raise SpecError(f"{sidecar}: no {sidecar.stem}.sql next to it; a sidecar describes the "
                            "derived table of the same name")
    clash = set(names) & {s.lower() for s in sources}
    if clash:
        raise SpecError(f"{folder}: {', '.join(sorted(clash))} is both a source and a SQL file; rename the file")
    known = {**{s.lower(): s for s in sources}, **names}
    specs: dict[str, TableSpec] = {}
    for path in sql_files:
        name, sql = path.stem, path.read_text()
        sidecar_path = next((p for p in (path.with_suffix(".yml"), path.with_suffix(".yaml")) if p.exists()), None)
        sidecar = _read_sidecar(sidecar_path) if sidecar_path else _Sidecar()
        expectations = [_expectation(sidecar_path, i, e) for i, e in enumerate(sidecar.expectations, start=1)]
        if sidecar.key:
            if len(sidecar.key) == 1:  # the compound expectation wants two columns or more
                key_check = ExpectationSpec("expect_column_values_to_be_unique", {"column": sidecar.key[0]},
                                            KEY_CHECK, "table")
            else:
                key_check = ExpectationSpec("expect_compound_columns_to_be_unique",
                                            {"column_list": list(sidecar.key)}, KEY_CHECK, "table")
            expectations.append(key_check)
        seen: dict[str, ExpectationSpec] = {}
        for expectation in expectations:
            if expectation.name in seen:
                raise SpecError(f"{sidecar_path}: two expectations are named {expectation.name!r}; "
                                "give one a `name:`")
            seen[expectation.name] = expectation
        specs[name] = TableSpec(
            name=name,
            sql=sql,
            sql_path=path,
            inputs=_inputs(name, sql, known),
            description=sidecar.description,
            key=tuple(sidecar.key) if sidecar.key else None,
            partitioning=sidecar.partitioning,
            partition_start=(utc(sidecar.partition_start) if sidecar.partition_start
                             else period_start(default_start, sidecar.partitioning)),
            strict=sidecar.strict,
            group=sidecar.group,
            expectations=tuple(expectations),
            sidecar_path=sidecar_path,
        )
    ordered = _dependency_order(specs)
    _check_partitioning(ordered)
    return ordered


def _dependency_order(specs: dict[str, TableSpec]) -> dict[str, TableSpec]:
    ordered: dict[str, TableSpec] = {}
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name in visiting:
            cycle = " -> ".join(visiting[visiting.index(name):] + [name])
            raise DefinitionError(name, f"definitions read each other in a cycle ({cycle})",
                                  fix="A derived table cannot depend on itself through other tables")
        visiting.append(name)
        for upstream in specs[name].inputs:
            if upstream in specs:
                visit(upstream)
        visiting.pop()
        ordered[name] = specs[name]

    for name in sorted(specs):
        visit(name)
    return ordered


def _check_partitioning(specs: dict[str, TableSpec]) -> None:
    """An epoch of a table needs every derived input at the same epoch end, so a table's epochs
    must be at least as coarse as its inputs' (a daily table may read an hourly one, not the
    reverse) and may not start before them."""
    for spec in specs.values():
        for upstream in (specs[name] for name in spec.inputs if name in specs):
            if CADENCES.index(spec.partitioning) < CADENCES.index(upstream.partitioning):
                raise SpecError(
                    f"{spec.sidecar_path or spec.sql_path}: {spec.name} is {spec.partitioning} but reads "
                    f"{upstream.name}, which is {upstream.partitioning}: an {spec.partitioning} epoch "
                    f"needs {upstream.name} at every {spec.partitioning} boundary. Make {spec.name} "
                    f"{upstream.partitioning} (or coarser), or {upstream.name} finer"
                )
            # a daily table may start on the day its hourly input starts: its first epoch ends at
            # the next midnight, where the input has a version
            if spec.partition_start < period_start(upstream.partition_start, spec.partitioning):
                raise SpecError(
                    f"{spec.sidecar_path or spec.sql_path}: {spec.name} starts at "
                    f"{spec.partition_start.isoformat()}, before its input {upstream.name} "
                    f"({upstream.partition_start.isoformat()}); set partition_start no earlier"
                )


def period_start(moment: datetime, partitioning: str) -> datetime:
    """The start of the hour (hourly) or UTC day (daily) holding `moment`."""
    moment = utc(moment).replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0) if partitioning == "daily" else moment


def upstream_chain(specs: Mapping[str, TableSpec], name: str) -> list[TableSpec]:
    """`name` and the derived tables it reads, directly or not, in dependency order."""
    wanted, stack = set(), [name]
    while stack:
        current = stack.pop()
        if current in wanted:
            continue
        wanted.add(current)
        stack.extend(n for n in specs[current].inputs if n in specs)
    return [spec for spec in specs.values() if spec.name in wanted]
