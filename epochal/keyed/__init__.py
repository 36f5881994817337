"""Keyed reads and state on the driver: the reads one refresh shares (`shared_reads`), inputs
kept sorted by a key (`arrangements`), the operators' state tables (`state`), and beneath them the
pruning of files and row groups by key (`file_pruning`) and local copies of remote files
(`local_copies`)."""
