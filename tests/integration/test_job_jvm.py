"""The JVM the job starts itself (local master) runs the serial collector (`job.LOCAL_JVM_OPTIONS`), and an
operator's `--conf spark.driver.extraJavaOptions=...` replaces that choice. Each case is a real Spark JVM
started by `job.build_spark` in a process of its own (a JVM's options are fixed when it starts)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent("""
    import json, sys
    from electra.streaming.job import JobConfig, build_spark

    extra = json.loads(sys.argv[1])
    spark = build_spark(JobConfig(bootstrap="127.0.0.1:1", controllers=["127.0.0.1:1"], checkpoint=sys.argv[2],
                                  extra_conf=extra))
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    print(json.dumps(sorted(beans.get(i).getName() for i in range(beans.size()))))
    spark.stop()
""")


def _collectors(tmp_path, extra: dict) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(extra), str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_local_jvm_runs_the_serial_collector_unless_the_operator_says_otherwise(tmp_path):
    assert _collectors(tmp_path, {}) == ["Copy", "MarkSweepCompact"]
    assert _collectors(tmp_path, {"spark.driver.extraJavaOptions": "-XX:+UseParallelGC"}) == \
        ["PS MarkSweep", "PS Scavenge"]
