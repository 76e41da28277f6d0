"""Union fields validated as the JSON type the client sent picks (a text or a list), their
refusals naming the field as the client sent it: pydantic names each branch it tried in an
error's place, which a refusal's `param` and message showed as fields the client never sent
(`prompt.text`, `messages.0.content.list`, `stop.constrained-str`)."""

from __future__ import annotations

from typing import Any

from pydantic import Discriminator, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import InitErrorDetails, PydanticCustomError


def _branch_unnamed(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A union's errors placed where the client sent the value: pydantic puts the branch's tag
    first in each error's place, which a refusal's `param` and message named as a field the
    client never sent (`prompt.text`, `messages.0.content.list`)."""
    try:
        return handler(value)
    except ValidationError as exc:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(error["type"], error["msg"]),
                loc=error["loc"][1:],
                input=error["input"],
            )
            for error in exc.errors(include_url=False)
        ]
        raise ValidationError.from_exception_data(exc.title, errors) from None


def _by_json_type(value: Any) -> str:
    """A union's branch by the JSON type sent: only that branch's errors are reported (a smart
    union reported each branch's, the string's "Input should be a valid string" for a list)."""
    return "list" if isinstance(value, list) else "text"


# Both annotate a union of a text (`Tag("text")`) and a list (`Tag("list")`): the branch the
# value's JSON type picks validates it, its errors named as the client sent the value
BY_JSON_TYPE, AS_SENT = Discriminator(_by_json_type), WrapValidator(_branch_unnamed)
