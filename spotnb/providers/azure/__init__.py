"""Azure Spot VMs: the provider and its cloud-side coordinator."""
