"""File and process mechanics: files written inside a folder and never through a link, staged writes, a full disk,
the folder lock, recorded checksums, a barrier between processes, the shared file names."""
