"""File and process mechanics: how files and folders are written safely, and how processes share them.

Files written inside a folder and never through a link, staged writes, a full disk, the folder lock, recorded
checksums, a barrier between processes, the shared file names."""
