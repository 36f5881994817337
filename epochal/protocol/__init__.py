"""The epoch protocol: one step of one table per epoch, decided (`rescan`, `cost`) and recorded
(`epoch`), its change computed over a step's environment (`change`, `context`) and written
(`output`, `writes`), so that a rerun is exact and a crash loses or doubles nothing
(docs/architecture.md)."""
