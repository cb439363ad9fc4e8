"""The reconcile's decisions (pure): from what the operator observed, what to write and what to report.

reconcile/ holds the I/O edge (the watch, the writes, the scrapes); everything it decides comes from here.
"""
