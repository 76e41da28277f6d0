"""One partition's I/O: reading and claiming entries, reclaiming abandoned ones, writing
results and tokens, and how an entry ends (finish, expiry, webhook events)."""
