"""``berth run``: the lease client, the engine process, the actions (park, wake, lend, return,
drain), the watchdog and the command line."""
