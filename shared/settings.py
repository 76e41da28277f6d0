"""Process configuration from `CONVEYOR_*` environment variables, read once per process."""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of the producer and the workers; README documents each one."""

    model_config = SettingsConfigDict(env_prefix="CONVEYOR_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "cv:"
    model_repository: Path = Path("model_repository")
    artifact_dir: Path = Path("var/models")
    models: Annotated[list[str], NoDecode] = Field(default_factory=list)

    host: str = "127.0.0.1"
    port: int = 8000
    instance_id: str = Field(default_factory=_default_instance_id)
    max_body_bytes: int = 1_048_576
    max_wait_s: float = 60.0
    result_ttl_s: int = 86_400
    log_level: str = "INFO"

    block_ms: int = 1_000
    shutdown_grace_s: float = 30.0

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
