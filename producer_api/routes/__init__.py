"""The routes resource: a model's live split between variants, shadows and stickiness."""
