"""AWS EC2 Spot: the provider (launch, poll, terminate) and its cloud-side coordinator."""
