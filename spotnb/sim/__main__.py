"""`python -m spotnb.sim --scenario FILE ...` (same as `spotnb simulate`)."""

from spotnb.sim.cli import main

raise SystemExit(main())
