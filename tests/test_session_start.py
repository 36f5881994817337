"""A session with a local master records the JARs Ivy resolved for the Delta package, and later
sessions start with them instead of resolving again (resources.session.resolved_jars); a record
that names a JAR no longer there is not used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import child_environment

REPOSITORY = Path(__file__).resolve().parent.parent
CHILD = """
import sys
from resources.session import SparkSettings, delta_spark_session
spark = delta_spark_session(SparkSettings(log_file=sys.argv[1], shuffle_partitions=1))
spark.range(3).write.format("delta").mode("append").save(sys.argv[2])
print(spark.read.format("delta").load(sys.argv[2]).count())
"""


@pytest.mark.long  # three Spark drivers of their own
def test_later_sessions_start_with_the_jars_the_first_resolved(tmp_path):
    environment = child_environment(XDG_CACHE_HOME=str(tmp_path / "cache"))

    def start(run: str) -> tuple[str, int]:
        log = tmp_path / f"{run}.log"
        done = subprocess.run([sys.executable, "-c", CHILD, str(log), str(tmp_path / "table")], env=environment,
                              cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return log.read_text(), int(done.stdout.split()[-1])

    first, rows = start("first")
    assert "resolving dependencies" in first and rows == 3
    [record] = (tmp_path / "cache" / "epochal").glob("jars-*.json")
    jars = json.loads(record.read_text())
    assert any("delta-spark" in jar for jar in jars) and all(Path(jar).is_file() for jar in jars), jars

    second, rows = start("second")
    assert "resolving dependencies" not in second and rows == 6  # Delta's extension and catalog loaded

    record.write_text(json.dumps(jars + [str(tmp_path / "gone.jar")]))
    third, rows = start("third")
    assert "resolving dependencies" in third and rows == 9
    assert json.loads(record.read_text()) == jars  # recorded again as resolved
