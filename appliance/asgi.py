"""The ASGI application daphne serves: HTTP through Django, WebSockets through Channels consumers.

HTTP bodies over the size limit are refused before Django reads them (`webui.door.BodyLimit`).
WebSockets pass Channels' origin check against the machine's names (`ALLOWED_HOSTS`: a missing,
"null" or foreign Origin is refused) and carry the Django session, which the consumers require.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

django_app = get_asgi_application()  # sets Django up before the consumers import models

# by name, as INSTALLED_APPS and include("webui.urls") do: the project imports nothing from the web app
websocket_urlpatterns = import_string("webui.routing.websocket_urlpatterns")
BodyLimit = import_string("webui.door.BodyLimit")

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_app, settings.DATA_UPLOAD_MAX_MEMORY_SIZE),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
