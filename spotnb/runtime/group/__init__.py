"""Several processes or instances training as one: torchft groups (elastic, lighthouse),
the local process group and its ranks, and torchrun's group and workers.
"""
