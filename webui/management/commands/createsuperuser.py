"""`python -m django createsuperuser`, with the password validators applied without a terminal too.

Django's own command checks a password typed at its prompt against `AUTH_PASSWORD_VALIDATORS` (and offers
to bypass the check: whoever answers is at the machine's console), but takes `DJANGO_SUPERUSER_PASSWORD`
under `--noinput` unchecked. This one refuses a weak one there too, naming what is wrong. It wins over
Django's because `webui` comes before `django.contrib.auth` in `INSTALLED_APPS`.
"""

import os

from django.contrib.auth.management.commands import createsuperuser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError


class Command(createsuperuser.Command):
    def handle(self, *args, **options):
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if not options["interactive"] and password is not None:
            field = self.UserModel.USERNAME_FIELD
            name = options.get(field) or os.environ.get(f"DJANGO_SUPERUSER_{field.upper()}") or ""
            try:
                validate_password(password, self.UserModel(**{field: name}))
            except ValidationError as e:
                raise CommandError(f"DJANGO_SUPERUSER_PASSWORD: {' '.join(e.messages)}") from None
        return super().handle(*args, **options)
