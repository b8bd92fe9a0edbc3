"""The providers: each cloud's `Provider` (`aws/`, `azure/`, `gcp/`, `local/`), the contract they
implement (`base`), and what they share (bootstrap, coordinator, shipping, quotas, cleanup).

Nothing is imported here, so that importing one provider imports no other (nor its SDK). The
registry of providers (name → settings and class, the `spotnb.providers` entry-point group)
is `spotnb.settings.registry`: `spot.Config` is composed from it, and the settings side must
not import this package.
"""
