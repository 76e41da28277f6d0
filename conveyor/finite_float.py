"""A click float type that refuses NaN and the infinities. click's FloatRange lets NaN through
any bound (every comparison with NaN is false), and what the number reached failed with a
traceback: `time.sleep(nan)`, or a JSON body that cannot hold it."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
