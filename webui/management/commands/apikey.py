"""`python -m django apikey create NAME [--scope chat|admin] | list | revoke PREFIX` (settings: appliance.settings).

A new key is a chat key unless `--scope admin` says otherwise (`webui.models.Scope`)."""

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError
from django.utils import timezone

from inference.errors import disk_full
from webui.models import ApiKey, Scope


class Command(BaseCommand):
    help = "Create, list or revoke API keys (stored hashed; a new key is shown once)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("name")
        create.add_argument(
            "--scope",
            choices=Scope.values,
            default=Scope.CHAT,
            help="chat: generate and list (default); admin: also pull, delete, load and unload models",
        )
        sub.add_parser("list")
        sub.add_parser("revoke").add_argument("prefix", help="the key's first characters, as `list` shows them")

    def handle(self, *args, action, **opts):
        if action == "create":
            try:
                _, key = ApiKey.create(opts["name"], opts["scope"])
            except OperationalError as e:
                if disk_full(e):  # SQLite rolled the insert back: no key exists
                    raise CommandError("the data disk is full: no key was created; free space and retry") from e
                raise
            self.stdout.write(key)
        elif action == "list":
            for k in ApiKey.objects.all():
                self.stdout.write(
                    f"{k.prefix}  {k.name}  {k.scope}  created {k.created:%Y-%m-%d}{'  revoked' if k.revoked else ''}"
                )
        else:
            n = ApiKey.objects.filter(prefix__startswith=opts["prefix"], revoked=None).update(revoked=timezone.now())
            if n == 0:
                raise CommandError(f"no active key starts with {opts['prefix']!r}; `apikey list` shows them")
            self.stdout.write(f"revoked {n} key{'s' * (n != 1)}")
