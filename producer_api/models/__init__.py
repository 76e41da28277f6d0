"""The models resource: what is served and how deep its queues are."""
