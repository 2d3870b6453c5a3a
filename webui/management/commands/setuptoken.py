"""`python -m django setuptoken`: the one-time token `/setup/` takes, while no administrator exists.

A flashed board's firstboot writes the token file (`RKMOJO_SETUP_TOKEN_FILE`); on a PC nothing did, so
`rkmojo up` runs this at every start: with no superuser and setup not done it prints the token,
writing a new random one (mode 0600, created atomically) when the file is missing; once setup is
done it prints nothing and removes a token file of its own data directory (the token is spent).
"""

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from webui.setup_page import closed


class Command(BaseCommand):
    help = "Print the one-time setup token while no administrator exists (creating it if needed)."

    def handle(self, *args, **opts):
        path = Path(settings.RKMOJO["SETUP_TOKEN_FILE"])
        if closed():
            if path.parent == settings.DATA_DIR:
                path.unlink(missing_ok=True)
            return
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            token = ""
        if not token:
            token = secrets.token_urlsafe(18)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            os.replace(tmp, path)
        self.stdout.write(token)
