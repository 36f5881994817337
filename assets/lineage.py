"""Each derived table's columns in the Dagster catalog: `dagster/column_schema` (name, type,
nullability) and `dagster/column_lineage` (each output column's input table columns, from
`epochal.lineage` over the SQL the engine compiles).

Two moments know them:
- **definition time** (the code location loads): the schemas of the sources and of the derived
  tables already written are read from their Delta logs with delta-rs (no Spark, milliseconds a
  table, a local warehouse only), so an asset shows its columns and their lineage before any run;
  a table not written yet gets its lineage from its inputs' schemas (its inputs' output columns,
  for a derived input not written yet either) and no column schema;
- **materialization**: from the engine's own definition (its compiled, qualified tree and the
  table's Delta schema), on every materialization, as Dagster's docs attach column lineage.
"""

from __future__ import annotations

import logging
from typing import Mapping

from dagster import AssetKey, TableColumn, TableColumnConstraints, TableColumnDep, TableColumnLineage, TableSchema

from assets.specs import TableSpec
from epochal.lineage import OutputLineage, column_lineage, lineage_of_sql

log = logging.getLogger("epochal")

SCHEMA = "dagster/column_schema"
LINEAGE = "dagster/column_lineage"


def table_schema(fields, key: tuple[str, ...] | None = None, engine_key: set[str] = frozenset(),
                 lineage: TableColumnLineage | None = None) -> TableSchema:
    """A Spark StructType's fields as Dagster's TableSchema; declared and merge keys noted, and
    each column's input columns from `lineage` ("from lineitem.l_discount, ..."): open-source
    Dagster shows a column's description in the asset's Columns table, its lineage graph only in
    Dagster+."""
    declared = set(key or ())
    sources = lineage.deps_by_column if lineage is not None else {}
    columns = []
    for f in fields:
        notes = [n for n, on in (("declared key", f.name in declared), ("merge key", f.name in engine_key)) if on]
        if sources.get(f.name):
            notes.append("from " + ", ".join(f"{d.asset_key.to_user_string()}.{d.column_name}" for d in sources[f.name]))
        columns.append(TableColumn(
            name=f.name, type=f.dataType.simpleString(), description=", ".join(notes) or None,
            constraints=TableColumnConstraints(nullable=f.nullable),
        ))
    return TableSchema(columns=columns)


def table_lineage(outputs: list[OutputLineage], columns: list[str] | None,
                  inputs: Mapping[str, tuple[str, Mapping[str, str]]]) -> TableColumnLineage:
    """`outputs` as Dagster's TableColumnLineage. `columns`: the table's column names by position
    (its Delta schema; None: the names sqlglot gives them); `inputs`: lower-case table name ->
    (asset name, lower-case column -> column as the input spells it). Columns computed from no
    input column (count(*), literals) are left out."""
    deps: dict[str, list[TableColumnDep]] = {}
    for output in outputs:
        name = columns[output.position] if columns and output.position < len(columns) else output.name
        found = []
        for table, column in output.inputs:
            asset, spelled = inputs.get(table.lower(), (table, {}))
            dep = TableColumnDep(asset_key=AssetKey(asset), column_name=spelled.get(column.lower(), column))
            if dep not in found:
                found.append(dep)
        if found:
            deps[name] = found
    return TableColumnLineage(deps_by_column=deps)


def engine_metadata(engine, spec: TableSpec) -> dict:
    """The column schema and lineage of a table the engine has defined."""
    table = engine.table(spec.name)
    engine_key = {table.schema.fields[i].name for i in table.key} if table.key else set()
    lineage = None
    try:
        inputs = {}
        for name in table.compiled.inputs:
            inputs[name.lower()] = (name, {f.name.lower(): f.name for f in engine.schema_of(name).fields})
        outputs = column_lineage(table.compiled.tree)
        lineage = table_lineage(outputs, [f.name for f in table.schema.fields], inputs)
    except Exception as error:  # noqa: BLE001 - lineage is a description: never fail a run for it
        log.warning("%s: no column lineage (%s)", spec.name, error)
    metadata = {SCHEMA: table_schema(table.schema.fields, spec.key, engine_key, lineage)}
    if lineage is not None:
        metadata[LINEAGE] = lineage
    return metadata


def definition_metadata(specs: Mapping[str, TableSpec], root: str | None) -> dict[str, dict]:
    """Per derived table, what its asset definition can say of its columns before a run: read
    from the warehouse's Delta logs (a local warehouse only, so a code location never waits on
    an object store); {} per table without a warehouse."""
    from epochal.storage.warehouse import Warehouse, is_local, local_path

    found: dict[str, dict] = {name: {} for name in specs}
    if not root or not is_local(root):
        return found
    warehouse = Warehouse(root)
    schemas: dict[str, dict[str, str]] = {}  # lower-case table -> column -> type, for qualifying
    spelled: dict[str, tuple[str, dict[str, str]]] = {}

    def known(name: str, fields) -> None:
        schemas[name.lower()] = {f.name.lower(): f.dataType.simpleString() for f in fields}
        spelled[name.lower()] = (name, {f.name.lower(): f.name for f in fields})

    wanted = {i for spec in specs.values() for i in spec.inputs if i not in specs}
    for name in sorted(wanted):
        fields = _delta_fields(local_path(warehouse.source_path(name)))
        if fields is not None:
            known(name, fields)
    for spec in specs.values():  # dependency order: a table after the tables it reads
        fields = _delta_fields(local_path(warehouse.table_path(spec.name)))
        if fields is not None:
            found[spec.name][SCHEMA] = table_schema(fields, spec.key)
        if not all(i.lower() in schemas for i in spec.inputs):
            continue
        try:
            outputs = lineage_of_sql(spec.name, spec.sql, {i: schemas[i.lower()] for i in spec.inputs})
        except Exception as error:  # noqa: BLE001 - the engine reports a definition's errors when it runs
            log.debug("%s: no column lineage at definition time (%s)", spec.name, error)
            continue
        columns = [f.name for f in fields] if fields is not None and len(fields) == len(outputs) else None
        found[spec.name][LINEAGE] = table_lineage(outputs, columns, spelled)
        if fields is not None:
            found[spec.name][SCHEMA] = table_schema(fields, spec.key, lineage=found[spec.name][LINEAGE])
        if fields is not None:
            known(spec.name, fields)
        else:  # its downstream tables qualify against its output names; types do not matter there
            schemas[spec.name.lower()] = {o.name.lower(): "string" for o in outputs}
            spelled[spec.name.lower()] = (spec.name, {o.name.lower(): o.name for o in outputs})
    return found


def _delta_fields(path: str):
    from epochal.storage.deltalog import DeltaLog

    try:
        log_ = DeltaLog.open(path)
        return None if log_ is None else list(log_.spark_schema().fields)
    except Exception:  # noqa: BLE001 - a damaged or foreign table: the run will say what is wrong
        return None
