"""Diagnoses as measures: what a trained run's memory holds, writes and reads on an evaluation's own
examples (state drift, a delta rule's retention, a linear read's shares, ARMT's write gate, kNN ranks,
copying). Each module is one measure; experiments/<topic>/ holds its command line."""
