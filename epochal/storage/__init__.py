"""Delta tables and their logs: reading a log without Spark (`deltalog`), small commits by delta-rs
(`commits`), the engine's own records (`metastore`, `ledger`, the source remap in `reclock`),
commit times (`clock`), and the warehouse's layout and reachability (`warehouse`, `access`)."""
