"""What a model's or a variant's name may be, in a module of its own: the settings check
`CONVEYOR_MODELS` against it and the model repository reads its settings, so neither imports
the other to learn it."""

import re

NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"  # a model's or a variant's name, wherever one is accepted
NAME_PATTERN = re.compile(NAME)
