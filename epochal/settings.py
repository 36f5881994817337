"""The session settings that change what a query returns, recorded with every step.

A derived table is the answer of its SQL under the settings it was computed with. The same SQL
over the same rows answers differently under another session time zone (a TIMESTAMP cast to a
string or a DATE), with ANSI mode on or off (an overflow is an error or a NULL; a malformed string
cast is an error or a NULL), with decimal precision loss allowed or not (the scale of a product or
a quotient), or under another default collation (what compares equal). An incremental step adds
today's change, computed under today's settings, to a table computed under the earlier ones; where
the settings differ the sum is neither answer. So each step records the settings below, and a step
whose settings differ from its table's last step is a rescan, reason SETTINGS_CHANGED (Databricks
does the same for its materialized views). Settings that only make a query fail or succeed
(`spark.sql.caseSensitive`) or that change how it runs but not what it returns (shuffle partitions,
adaptive execution) are not recorded.
"""

from __future__ import annotations

SETTINGS_CHANGED = "SETTINGS_CHANGED"

RESULT_SETTINGS = (
    "spark.sql.session.timeZone",
    "spark.sql.ansi.enabled",
    "spark.sql.decimalOperations.allowPrecisionLoss",
    "spark.sql.session.collation.default",
    "spark.sql.timestampType",
    "spark.sql.legacy.timeParserPolicy",
    "spark.sql.storeAssignmentPolicy",
    "spark.sql.legacy.sizeOfNull",
    "spark.sql.legacy.statisticalAggregate",
    "spark.sql.legacy.literal.pickMinimumPrecision",
    "spark.sql.legacy.allowNegativeScaleOfDecimal",
    "spark.sql.ansi.doubleQuotedIdentifiers",
    "spark.sql.legacy.nullInEmptyListBehavior",
    "spark.sql.legacy.castComplexTypesToString.enabled",
    "spark.sql.legacy.charVarcharAsString",
    "spark.sql.function.concatBinaryAsString",
    "spark.sql.function.eltOutputAsString",
    "spark.sql.legacy.integerGroupingId",
    "spark.sql.mapKeyDedupPolicy",
)


_ABSENT: dict[str, set[str]] = {}  # by Spark version: the settings it does not have


def _value(spark, name: str, absent: set[str] | None = None) -> str | None:
    """The setting's value in `spark`, None where this Spark has no such setting. That is learnt
    once per Spark version (`absent`, this Spark's set in _ABSENT): asking for a setting Spark lacks
    raises, and turning the JVM's error into Python's costs far more than the question (through
    Connect, it also logs the error)."""
    absent = absent if absent is not None else _ABSENT.setdefault(spark.version, set())
    if name in absent:
        return None
    try:
        value = spark.conf.get(name)
    except Exception:  # noqa: BLE001 - a setting this Spark does not have
        absent.add(name)
        return None
    return None if value is None else str(value)


def current(spark) -> dict[str, str | None]:
    """Each result setting's value in `spark` (its default where the session left it; None where
    this Spark has no such setting)."""
    absent = _ABSENT.setdefault(spark.version, set())
    return {name: _value(spark, name, absent) for name in RESULT_SETTINGS}


def ansi(spark) -> bool:
    """Whether ANSI mode is on (Spark 4's default)."""
    value = _value(spark, "spark.sql.ansi.enabled")
    return value is None or value.strip().lower() == "true"


def difference(recorded: dict | None, now: dict[str, str | None]) -> str | None:
    """What changed between the settings a table's last step recorded and `now`, or None. A step
    recorded before settings were recorded differs: what it ran under is unknown."""
    if recorded is None:
        return "the table's last step recorded no session settings (it was computed by an earlier epochal)"
    changed = [f"{name} {recorded.get(name)!s} -> {now.get(name)!s}" for name in RESULT_SETTINGS
               if recorded.get(name) != now.get(name)]
    return "; ".join(changed) or None


def apply(values: dict[str, str | None], target) -> None:
    """Set `values` (`current` of the caller's session) in `target`, a child session (Spark's
    newSession starts from the defaults), so that a step computes under the caller's settings."""
    for name, value in values.items():
        if value is not None:
            target.conf.set(name, value)
