"""berthd: lifetimes (main), the single writer (broker), reads -> events, the control API, the
state file, the status JSON and metrics."""
