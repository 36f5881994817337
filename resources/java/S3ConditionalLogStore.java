package io.epochal.storage;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

import io.delta.storage.S3SingleDriverLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's S3 LogStore made safe for many drivers: a commit (a write without overwrite) is one S3
 * PUT with If-None-Match: * (S3A's conditional create), so when two drivers commit the same
 * version the store keeps the first and refuses the second, which Delta then handles as a
 * concurrent commit (conflict check and retry). Delta's own S3SingleDriverLogStore only checks for
 * the file first, which two drivers can both pass. Needs a store that honours conditional writes
 * (AWS S3, MinIO) and hadoop-aws 3.4.2 or later.
 */
public class S3ConditionalLogStore extends S3SingleDriverLogStore {
    private static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

    public S3ConditionalLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        if (overwrite) {
            super.write(path, actions, overwrite, hadoopConf);
            return;
        }
        FileSystem fs = path.getFileSystem(hadoopConf);
        try {
            FSDataOutputStream stream = (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL, true).build();
            try {
                while (actions.hasNext()) {
                    stream.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
                }
            } finally {
                stream.close();  // the PUT happens here; a 412 means another driver won
            }
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            throw new FileAlreadyExistsException(path.toString());
        } catch (IOException e) {
            if (preconditionFailed(e)) {
                throw new FileAlreadyExistsException(path.toString());
            }
            throw e;
        }
    }

    private static boolean preconditionFailed(Throwable error) {
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
            String message = String.valueOf(cause.getMessage());
            // S3A reports the store's 412 at close() as RemoteFileChangedException (named, not
            // imported: hadoop-aws is not on the classpath this is compiled against)
            if (cause instanceof org.apache.hadoop.fs.FileAlreadyExistsException
                    || cause.getClass().getName().equals("org.apache.hadoop.fs.s3a.RemoteFileChangedException")
                    || message.contains("412") || message.contains("PreconditionFailed")) {
                return true;
            }
        }
        return false;
    }
}
