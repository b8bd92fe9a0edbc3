"""Checkpoints on the instance: the checkpointer (snapshot, upload, restore, prune), the
gated chunked drain, incremental and sharded saves, staging and digests.
"""
