"""Logging in to the operator console as its login form does, for tests that read console pages
over plain HTTP: the form's CSRF token goes back with the pre-login cookie it is tied to."""

from __future__ import annotations

import re

import httpx


def console_login(client: httpx.Client, key: str) -> httpx.Response:
    form = client.get("/console/login").text
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', form)
    assert match is not None, form
    return client.post("/console/login", data={"key": key, "csrf": match[1]})
