"""The pure broker (seed 002, seed 000): model, units, ledger, admission, ladder, scheduler,
measures. No I/O, no clock, no logging: time comes in as an argument, effects go out as data."""
