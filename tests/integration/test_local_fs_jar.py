"""The job's local file system class (streaming/local_fs_jar.py) in a real Spark JVM: Spark's checkpoint
writes through it create, checksum and rename files with the modes Hadoop's own local file system gives
them, without one child process per file (Hadoop runs `chmod` per created file and `readlink` per
`FileContext` rename when its native library is absent, as with PySpark). `chmod` and `readlink` are
spied on through PATH, so the comparison with Hadoop's file system in the same test shows the spy works."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from electra.streaming.local_fs_jar import build_jar, spark_conf

pytestmark = pytest.mark.integration

FILES = 12

PROBE = textwrap.dedent("""
    import json, os, sys
    from pyspark.sql import SparkSession

    conf, d = json.loads(sys.argv[1]), sys.argv[2]
    b = (SparkSession.builder.master("local[1]").appName("local-fs-probe").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1"))
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    jvm, hconf = spark._jvm, spark._jsc.hadoopConfiguration()
    P = jvm.org.apache.hadoop.fs.Path
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
        P("file://" + d), hconf)
    for i in range(int(sys.argv[3])):  # what the offset and commit logs do: a temp file, its checksum, a rename
        out = manager.createAtomic(P(f"file://{d}/log{i}"), True)
        out.write(bytearray(b'{"batch": %d}' % i))
        out.close()
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(hconf)  # what Spark's RocksDB state store casts
    local.setPermission(P(f"file://{d}/log0"), jvm.org.apache.hadoop.fs.permission.FsPermission("600"))
    os.symlink(f"{d}/log1", f"{d}/link")
    print(json.dumps({"file_system": local.getClass().getName(), "raw": local.getRaw().getClass().getName(),
                      "symlink": local.getFileLinkStatus(P(f"file://{d}/link")).isSymlink(),
                      "regular": local.getFileLinkStatus(P(f"file://{d}/log1")).isSymlink()}))
    spark.stop()
""")


def _probe(tmp_path, name: str, conf: dict[str, str]) -> tuple[dict, list[str], str]:
    """Run the probe in its own Spark JVM; returns its answer, the spied commands and the files' folder."""
    spy, work = tmp_path / f"spy-{name}", tmp_path / f"files-{name}"
    spy.mkdir()
    work.mkdir()
    log = spy / "calls.log"
    for tool in ("chmod", "readlink"):
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True,
                              check=True).stdout.strip()
        (spy / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\nexec {real} "$@"\n')
        (spy / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{spy}:{os.environ['PATH']}")
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(conf), str(work), str(FILES)], env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    calls = log.read_text().splitlines() if log.exists() else []
    return answer, calls, str(work)


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_checkpoint_files_are_written_like_hadoops_without_a_process_per_file(tmp_path):
    jar = build_jar()
    assert jar is not None and jar.exists(), "javac must be installed (make setup installs a JDK)"

    hadoop, hadoop_calls, hadoop_dir = _probe(tmp_path, "hadoop", {})
    nio, nio_calls, nio_dir = _probe(tmp_path, "nio", spark_conf(jar))

    # The spy sees Hadoop's own file system start a chmod per created file (and its checksum file)...
    assert not hadoop["file_system"].startswith("electra.")  # PySpark's: Hive's ProxyLocalFileSystem
    assert sum(c.startswith("chmod ") for c in hadoop_calls) >= FILES
    # ...and ours start none, while being what Spark's RocksDB state store can cast.
    assert nio["file_system"] == "electra.hadoop.NioLocalFileSystem"
    assert nio["raw"] == "electra.hadoop.NioRawLocalFileSystem"
    assert [c for c in nio_calls if not c.endswith("/link")] == []  # a real symbolic link is Hadoop's business

    for d in (hadoop_dir, nio_dir):
        for i in range(1, FILES):
            assert Path(f"{d}/log{i}").read_text() == f'{{"batch": {i}}}'
            assert os.path.exists(f"{d}/.log{i}.crc")  # Hadoop's checksums are kept
        assert not [f for f in os.listdir(d) if f.endswith(".tmp")]  # every temp file was renamed
        assert _mode(f"{d}/log0") == 0o600  # setPermission
    assert _mode(f"{nio_dir}/log1") == _mode(f"{hadoop_dir}/log1")  # created with the same mode
    # Link status: a regular file is answered without readlink, a symbolic link exactly as Hadoop answers it.
    assert nio["regular"] is False
    assert (nio["symlink"], nio["regular"]) == (hadoop["symlink"], hadoop["regular"])
