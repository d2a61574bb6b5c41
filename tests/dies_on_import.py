"""A module whose import fails, as a script that runs flows at import fails in a spawned worker."""

raise SystemExit("this module cannot be imported by a worker")
