"""Telemetry tests: one embedded SparkSession for every test that needs Spark (starting one
takes 10-25 s on two shared cores), and the ``spark`` marker for those tests."""

import pytest


def pytest_configure(config):
    # pyspark warns about pandas 3 whenever it loads its pandas glue; the job uses none of it
    config.addinivalue_line(
        "filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")
    config.addinivalue_line(
        "markers", "spark: starts Spark (one shared local[2] session; the standalone test "
        "also starts a master, a worker and spark-submit)")


@pytest.fixture(scope="session")
def spark():
    import os

    from appliance.ops.telemetry.routes_job import spark_session

    # short jobs: the client compiler alone starts the JVM's code much sooner on two cores
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                          "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell")

    session = spark_session("local[2]", app="topicwire-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
