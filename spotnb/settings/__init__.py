"""What a user configures: `Config` and each provider's settings models.

Light on purpose (no cloud SDK, no torch): a notebook builds a `Config` before anything
launches, and every field is checked here, with the fix in the error. `base` holds what every
provider's settings share, `registry` the providers spotnb knows (built-in and by entry
point), from which `config.Config` is composed.
"""
