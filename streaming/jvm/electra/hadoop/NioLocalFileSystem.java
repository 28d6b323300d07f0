package electra.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * {@code fs.file.impl}: Hadoop's checksummed local file system over {@link NioRawLocalFileSystem}.
 * It must stay a {@link LocalFileSystem}: Spark's RocksDB state store casts {@code FileSystem.getLocal}.
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}
