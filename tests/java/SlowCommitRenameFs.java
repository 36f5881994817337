package io.epochal.tests;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * Hadoop's local file system as FileContext sees it (LocalFs: checksums over RawLocalFs), except
 * that a rename onto a Delta commit file (_delta_log/NNNNNNNNNNNNNNNNNNNN.json) pauses for
 * `epochal.test.commitRenamePauseMs` (default 100) milliseconds just before the rename itself.
 * Delta-Spark's HDFSLogStore, which commits to file: paths, renames through FileContext with
 * Rename.NONE, which Hadoop implements as checks of the destination ("is it there? no") followed
 * by RawLocalFileSystem.rename (FileSystem.rename with options, the last check), and a local rename
 * replaces the destination. The pause comes after the last check, so it widens the window in which
 * another process's commit of the same version is overwritten from microseconds to the pause:
 * tests/test_commit_race.py then shows the race within seconds instead of once in a while.
 * Only for tests: `spark.hadoop.fs.AbstractFileSystem.file.impl` in a child's session.
 */
public class SlowCommitRenameFs extends ChecksumFs {
  public static final String PAUSE_MS = "epochal.test.commitRenamePauseMs";

  public SlowCommitRenameFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new SlowRaw(uri, conf, conf.getLong(PAUSE_MS, 100)));
  }

  /** org.apache.hadoop.fs.local.RawLocalFs (whose constructor is not public) over PausingRaw. */
  private static final class SlowRaw extends DelegateToFileSystem {
    SlowRaw(URI uri, Configuration conf, long pauseMs) throws IOException, URISyntaxException {
      super(uri, new PausingRaw(pauseMs), conf, "file", false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;
    }
  }

  /** RawLocalFileSystem whose rename onto a commit file pauses first. */
  private static final class PausingRaw extends RawLocalFileSystem {
    private final long pauseMs;

    PausingRaw(long pauseMs) {
      this.pauseMs = pauseMs;
    }

    @Override
    public boolean rename(Path src, Path dst) throws IOException {
      Path parent = dst.getParent();
      if (parent != null && parent.getName().equals("_delta_log") && dst.getName().matches("\\d{20}\\.json")) {
        try {
          Thread.sleep(pauseMs);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      return super.rename(src, dst);
    }
  }
}
