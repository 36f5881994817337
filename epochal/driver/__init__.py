"""Operators evaluated on the driver, in Arrow, where a step's rows are held there exactly: the
same results Spark computes, taken only where Arrow decides them as Spark does (a rule hands
everything else to Spark). The rules in `epochal.rules` call these; nothing here knows a rule."""
