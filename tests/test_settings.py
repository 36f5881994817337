"""Session settings that change results (epochal/settings.py): a step computes under its caller's
settings, also in the child sessions parallel steps run in, and a change of them rescans with
SETTINGS_CHANGED instead of adding today's change, computed under new settings, to a table
computed under the old ones."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epochal import Engine, settings
from tests.support import SyntheticSource, assert_matches_recompute

ZONE = "spark.sql.session.timeZone"


@pytest.fixture
def utc(spark):
    before = spark.conf.get(ZONE)
    spark.conf.set(ZONE, "UTC")
    yield
    spark.conf.set(ZONE, before)


def test_a_time_zone_change_rescans_with_its_reason_and_steps_use_the_callers_zone(spark, warehouse, utc):
    root = f"{warehouse}/zone"
    moment = datetime(2026, 3, 1, 23, 30, tzinfo=timezone.utc)
    source = SyntheticSource(spark, f"{root}/sources/events", "id bigint, at timestamp", [(1, moment)])
    engine = Engine(spark, root, parallelism=2, cost_model=False)
    engine.source("events")
    # two tables: parallel steps, each in a child session that starts from Spark's defaults
    engine.define("as_text", "SELECT id, CAST(at AS STRING) AS local_time FROM events")
    engine.define("by_day", "SELECT CAST(at AS DATE) AS day, count(*) AS n FROM events GROUP BY CAST(at AS DATE)")
    engine.refresh()
    assert [r[0] for r in engine.read("as_text").select("local_time").collect()] == ["2026-03-01 23:30:00"]

    source.insert([(2, moment)])
    reports = {r.table: r for r in engine.refresh()}
    assert {r.technique for r in reports.values()} == {"incremental"}, reports
    assert_matches_recompute(engine, context="same zone")

    spark.conf.set(ZONE, "Asia/Tokyo")
    source.insert([(3, moment)])
    reports = {r.table: r for r in engine.refresh()}
    for report in reports.values():
        assert report.technique == "rescan", report
        assert report.reason.startswith(settings.SETTINGS_CHANGED), report.reason
        assert f"{ZONE} UTC -> Asia/Tokyo" in report.reason
    local = {r[0] for r in engine.read("as_text").select("local_time").collect()}
    assert local == {"2026-03-02 08:30:00"}, "rows of both zones mixed"
    assert {tuple(r) for r in engine.read("by_day").collect()} == {(datetime(2026, 3, 2).date(), 3)}
    assert_matches_recompute(engine, context="after the zone changed")

    source.insert([(4, moment)])
    reports = {r.table: r for r in engine.refresh()}
    assert {r.technique for r in reports.values()} == {"incremental"}, reports
    assert_matches_recompute(engine, context="incremental again in the new zone")
