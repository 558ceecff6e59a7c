"""What every task needs: a run logger that masks secrets, and transient-error retries."""

from __future__ import annotations

import logging
import re

from prefect import get_run_logger
from prefect.client.schemas.objects import State, TaskRun

from specsweep.errors import CommandOutcomeUnknown, HostError, HostKeyError
from specsweep.hosts import Host
from specsweep.profiles import ServerProfile
from specsweep.redact import RedactingLogger, Redactor


def run_logger(profile: ServerProfile | None = None, host: Host | None = None) -> RedactingLogger:
    """The Prefect run logger, with the profile's and host's secrets masked in every line."""
    redactor = profile.redactor() if profile is not None else Redactor()
    if host is not None:
        redactor.add(*host.secrets())
    base: logging.Logger | logging.LoggerAdapter[logging.Logger] = get_run_logger()
    return RedactingLogger(base, redactor)


def retry_transient(task: object, task_run: TaskRun, state: State) -> bool:
    """Retry when a host could not be reached or a connection dropped; never on a bad host key, nor
    after a command that must run once may have run."""
    try:
        state.result()
    except (HostKeyError, CommandOutcomeUnknown):
        return False
    except HostError:
        return True
    except Exception:  # noqa: BLE001 - anything else is not transient
        return False
    return False


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    key = re.sub(r"[^a-z0-9-]+", "-", "-".join(p for p in parts if p).lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100].strip("-") or "specsweep"
