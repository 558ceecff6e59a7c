"""Prefect's temporary server for the command line's flow runs, out of reach of the terminal's Ctrl-C.

With no Prefect server configured, Prefect starts a temporary one as a child of the command, in the
command's process group: a Ctrl-C at the terminal stops it together with the command. The run's
teardown then talks to an API that is gone: its hooks cannot give the host back, and Prefect's client
retries each call for about a minute before the run's servers are killed (measured: the first kill 67 s
after the Ctrl-C, the command gone after about 4 minutes).

Started here first, before the run, the same server runs in a process group of its own, so that only the
command gets the Ctrl-C and tears its run down through a live API; and it ends with the command however
the command ends (killed outright too): Linux's parent-death signal is set before the server's program
starts. Prefect's own code then finds this server: it keeps one temporary server per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
)

#: How long the temporary server may take to answer before the command gives up. Its first start on a machine
#: creates Prefect's database: 16-18 s alone on this 2-core machine on a slow day (7-8 s once it exists), so
#: Prefect's own 20 s left the first run of a new machine a few seconds from failing before it began, and once,
#: beside the end of another test, it did ("Timed out while attempting to connect to ephemeral Prefect API
#: server"). A longer setting of Prefect's is kept.
STARTUP_TIMEOUT_S = 120

# Run by the server's process before it becomes the server: SIGTERM when the command's process ends
# (PR_SET_PDEATHSIG, kept across exec), and no server at all if the command ended already.
_PARENT_DEATH = ("import ctypes, os, signal, sys\n"
                 "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
                 "if os.getppid() != int(sys.argv[1]):\n"
                 "    sys.exit(0)\n"
                 "os.execv(sys.argv[2], sys.argv[2:])\n")


class ShieldedServer(SubprocessASGIServer):
    """Prefect's temporary server, started in a process group of its own and ended with its parent."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        popen = subprocess.Popen

        def shielded(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
            return popen([sys.executable, "-c", _PARENT_DEATH, str(os.getpid()), *args], process_group=0, **kwargs)

        # Process-wide for the few milliseconds of Prefect's one call, made before the run starts anything else.
        subprocess.Popen = shielded  # type: ignore[misc,assignment]
        try:
            return super()._run_uvicorn_command()
        finally:
            subprocess.Popen = popen  # type: ignore[misc]


def start_temporary_server() -> str | None:
    """Start the temporary server where Prefect would start one (no server configured); its address, else None.
    Call it from the main thread, before anything reaches Prefect's API: the parent-death signal follows the
    thread that started the server, and Prefect's own server, once started, would be the one used. Elsewhere
    than on Linux (no parent-death signal) Prefect starts its own, as before."""
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value() or not sys.platform.startswith("linux"):
        return None
    server = ShieldedServer()
    if not isinstance(server, ShieldedServer):  # Prefect started its own already: that one serves
        return server.api_url if server.running else None
    server.start(timeout=max(STARTUP_TIMEOUT_S, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
    return server.api_url
