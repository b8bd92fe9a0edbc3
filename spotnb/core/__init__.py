"""What the notebook side and the instance side both use: the event protocol and log, the
job state reducer and its ledger, the store, the signed job spec, sizes, durations, sync.

The runtime on a VM imports these, so they import nothing from the notebook side.
"""
