"""Bounds on numbers an operator gives, in a module that imports nothing: the CLI's options
show and check them, and `conveyor up --help` or `conveyor autoscale --help` imported the
settings or the model repository (pydantic, YAML, JSON Schema) only to learn them."""

# The most processes `conveyor up` starts of one kind (producers; each model's workers): a typo
# (`--producers 80000`) forked until the machine ran out of memory or pids, then a traceback.
MAX_PROCESSES = 256
# The longest any of a config's durations may be: longer ones are typos, and Redis's millisecond
# arguments overflow far past it.
YEAR_S = 365 * 86_400.0
