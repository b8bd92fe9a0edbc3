"""What runs on the instance. Imports nothing from the notebook side (no widgets, no
controller, no provider control planes): only the store, the event log and the policies."""
