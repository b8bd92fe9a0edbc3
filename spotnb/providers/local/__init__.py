"""The local spot market: instances are processes on this machine, really killed (the provider,
its capacity, its preemption injector, the metadata server a VM would query, and the zygote
that forks instances fast).
"""
