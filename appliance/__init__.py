"""The appliance: the Django project (settings, ASGI routing), the Celery app and worker, `rkmojo up`.

Imports go webui → appliance → inference; nothing in `inference` imports this package.
"""
