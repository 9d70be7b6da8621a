"""Who hears about a campaign that waits, stops, fails or recovers: the ``[notify]`` table.

A site config's ``[notify]`` (``tasks._site.SiteConfig.notify``) is the default for its
campaigns; a campaign's own replaces it. Only the shape of each address is checked
here (``tasks`` does not import Apprise); ``unattended check`` asks Apprise itself.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["HTTP_URL", "NOTIFY_EVENTS", "NotifyConfig", "NotifyEvent"]

_STRICT = ConfigDict(extra="forbid", frozen=True)
#: An http(s) URL, as a site config's URL fields take it.
HTTP_URL = re.compile(r"^https?://\S+$")

NotifyEvent = Literal["suspend", "blocked", "escalated", "failed", "recovered"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("suspend", "blocked", "escalated", "failed", "recovered")


class NotifyConfig(BaseModel):
    """Who hears about a campaign that waits, stops, fails or recovers (``[notify]``).

    A site's table is the default for its campaigns; a campaign's own replaces it.
    """

    model_config = _STRICT

    urls: list[SecretStr] = Field(
        default_factory=list,
        max_length=20,
        description="Apprise URLs (slack://, workflows:// for Teams, matrixs://, ntfys://, "
        "mailtos://, json://...), one channel each; secrets: write '${VAR}' in a site config.",
    )
    webhook_url: SecretStr | None = Field(
        default=None,
        description="Slack/Mattermost-compatible incoming webhook (POST {'text': ...}); "
        "a secret: write '${VAR}' in a site config.",
    )
    email_to: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)]] = Field(
        default_factory=list, max_length=20, description="Addresses to mail."
    )
    email_from: str = Field(
        default="unattended@localhost", max_length=254, description="Sender address."
    )
    smtp_host: str = Field(
        default="127.0.0.1", min_length=1, max_length=253, description="SMTP relay host."
    )
    smtp_port: int = Field(default=25, ge=1, le=65535, description="SMTP relay port.")
    events: list[NotifyEvent] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS),
        description="Which events notify: suspend, blocked, escalated, failed, recovered.",
    )
    timeout_seconds: float = Field(
        default=10.0, gt=0.0, le=120.0, description="How long one delivery may take."
    )

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not HTTP_URL.match(value.get_secret_value()):
            raise ValueError("expected an http(s):// URL")
        return value

    @field_validator("urls")
    @classmethod
    def _apprise_urls(cls, value: list[SecretStr]) -> list[SecretStr]:
        # Only the shape here (tasks does not import Apprise); `check` asks Apprise itself.
        for index, url in enumerate(value):
            if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://", url.get_secret_value()):
                raise ValueError(f"urls[{index}]: expected an Apprise URL such as 'ntfys://...'")
        return value
