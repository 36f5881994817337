"""The epoch protocol: one step of one table per epoch, decided (`rescan`, `cost`), computed over
a step's environment (`context`), written (`writes`) and recorded (`epoch`), so that a rerun is
exact and a crash loses or doubles nothing (docs/architecture.md)."""
