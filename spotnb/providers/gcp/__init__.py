"""GCP Spot VMs: the provider, its coordinator, the zone list, the price catalog and errors."""
