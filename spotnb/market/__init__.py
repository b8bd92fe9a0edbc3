"""Where and when to run: prices and their cache, preemption processes and forecasts, the
placement of a job in a zone, the cost of moving a checkpoint, migration, regional stores and
what GPUs an instance type has.
"""
