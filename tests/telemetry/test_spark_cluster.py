"""The route job unchanged on a Spark standalone cluster: a master and a worker started from
pyspark's own jars (``spark-class``) on 127.0.0.1, the job file given to ``spark-submit
--master spark://127.0.0.1:PORT``; its route table equals the embedded local run's.

Slow (three JVMs besides the test's own: ~1-2 min on two shared cores), so one test only.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.ops.telemetry.store import TelemetryStore
from tests.appliance.helpers import free_port
from tests.telemetry.scenario import job, routes_of, scenario

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180
JOB_TIMEOUT_S = 400
QUICK_JVM = "-XX:TieredStopAtLevel=1"
"""Short-lived JVMs start sooner with the client compiler only."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env(tmp: Path) -> dict:
    return dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                SPARK_LOG_DIR=str(tmp / "logs"), SPARK_WORKER_DIR=str(tmp / "work"),
                SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
                SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)


def start_daemon(tmp: Path, name: str, argv: list[str]) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"{name}.log"
    proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *argv],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=tmp,
                            env=spark_env(tmp), start_new_session=True)
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_for(log: Path, text: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"{log.name}: exited\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"{log.name}: no {text!r} within {START_TIMEOUT_S} s\n"
                         f"{log.read_text()[-3000:]}")


@pytest.fixture
def cluster(tmp_path):
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    (tmp_path / "work").mkdir()
    # the worker retries until the master is up: start both at once
    master, mlog = start_daemon(tmp_path, "master", [
        "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
        "--webui-port", "0"])
    worker, wlog = start_daemon(tmp_path, "worker", [
        "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
        "--memory", "1g", "--webui-port", "0", "--work-dir", str(tmp_path / "work")])
    try:
        wait_for(wlog, "Successfully registered with master", worker)
        yield url, tmp_path / "work"
    finally:
        stop(worker)
        stop(master)


def test_spark_submit_to_a_standalone_cluster_gives_the_local_answer(spark, cluster, tmp_path):
    url, work = cluster
    telemetry = tmp_path / "telemetry"
    TelemetryStore(telemetry).write(scenario())
    out = tmp_path / "routes.json"
    submit = subprocess.run(
        [str(spark_home() / "bin" / "spark-submit"), "--master", url,
         "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
         "--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}",
         "--driver-java-options", QUICK_JVM, "--executor-memory", "512m",
         str(ROOT / "appliance" / "ops" / "telemetry" / "routes_job.py"),
         "--telemetry", str(telemetry), "--out", str(out), "--window", "2s", "--k", "2",
         "--margin", "0.2"],
        cwd=tmp_path, env=spark_env(tmp_path), capture_output=True, text=True,
        timeout=JOB_TIMEOUT_S)
    assert submit.returncode == 0, submit.stderr[-5000:]
    assert "a -> d: a > c > d" in submit.stdout
    # the work ran in an executor the worker launched for this application
    apps = [p for p in work.iterdir() if p.name.startswith("app-")]
    assert len(apps) == 1 and any(apps[0].iterdir())
    remote = json.loads(out.read_text())
    local = job(spark, telemetry)
    assert routes_of(remote) == routes_of(local)
    assert [r["cost"] for r in remote["routes"]] == [r["cost"] for r in local["routes"]]
    assert remote["paths"] == local["paths"]
    assert remote["changes"] == local["changes"] and remote["excluded"] == local["excluded"] == []
