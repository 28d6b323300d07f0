"""Hadoop's local file system without a child process per checkpoint file (`streaming/jvm/`).

Without Hadoop's native library, which PySpark does not ship, Hadoop's local file system runs
`chmod` for every file it creates and `readlink` for every `FileContext` rename. A micro-batch
writes its offset log, commit log and state changelog, each with a checksum file, so the JVM
started a dozen or more processes per batch: measured at 100 sets and four batches a second, a
third of a core in those children alone (docs/heartbeat-pipeline.md, round 5). The classes in
`streaming/jvm/` set permissions with java.nio instead and are otherwise Hadoop's own code.

They are compiled here, once per source version, into a jar cached under `~/.cache/electra`
(`ELECTRA_CACHE_DIR` moves it), with the JDK's `javac` and PySpark's own Hadoop jars on the class
path. Without a JDK the job keeps Hadoop's file system and says so once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger("electra.streaming.local_fs_jar")

SOURCES = Path(__file__).with_name("jvm")
FILE_SYSTEM = "electra.hadoop.NioLocalFileSystem"      # fs.file.impl
ABSTRACT_FILE_SYSTEM = "electra.hadoop.NioLocalFs"      # fs.AbstractFileSystem.file.impl


def _java_sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def cache_dir() -> Path:
    return Path(os.environ.get("ELECTRA_CACHE_DIR") or Path.home() / ".cache" / "electra")


def jar_path() -> Path:
    """Where this source version's jar lives (named by a hash of the sources and of Spark's Hadoop jars)."""
    h = hashlib.sha256()
    for src in _java_sources():
        h.update(src.relative_to(SOURCES).as_posix().encode() + b"\0" + src.read_bytes())
    h.update(",".join(sorted(p.name for p in _spark_jars().glob("hadoop-*.jar"))).encode())
    return cache_dir() / f"electra-hadoop-{h.hexdigest()[:16]}.jar"


def build_jar() -> Path | None:
    """The jar, compiled if this version is not cached yet; None (logged) when there is no JDK or it fails."""
    jar = jar_path()
    if jar.exists():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        log.warning("no JDK (javac) on this machine: Spark's checkpoint writes keep Hadoop's local file system, "
                    "which starts a chmod process per file (install openjdk-17-jdk-headless; `make setup` does)")
        return None
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="electra-javac-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-d", str(classes), "-cp", str(_spark_jars() / "*"),
               *map(str, _java_sources())]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log.warning("could not compile %s (keeping Hadoop's local file system): %s", SOURCES,
                        (done.stderr or done.stdout).strip()[-2000:])
            return None
        partial = Path(tmp) / "out.jar"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        fd, staged = tempfile.mkstemp(dir=jar.parent, prefix=jar.name, suffix=".tmp")
        os.close(fd)
        shutil.copyfile(partial, staged)
        os.replace(staged, jar)  # whole or absent, also when two jobs build it at once
    log.info("compiled %s", jar)
    return jar


def spark_conf(jar: Path) -> dict[str, str]:
    """Spark settings that put the jar on the driver's class path and make it the `file:` file system."""
    return {
        "spark.driver.extraClassPath": str(jar),
        "spark.hadoop.fs.file.impl": FILE_SYSTEM,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": ABSTRACT_FILE_SYSTEM,
    }


def main() -> int:
    """`python -m electra.streaming.local_fs_jar`: build (or find) the jar and print its path (deploy scripts)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    jar = build_jar()
    if jar is None:
        return 1
    print(jar)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
