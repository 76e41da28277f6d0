"""The canary resource: step a variant's share of traffic up while it stays healthy."""
