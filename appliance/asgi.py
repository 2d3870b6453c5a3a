"""The ASGI application daphne serves: HTTP through Django, WebSockets through Channels consumers."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

django_app = get_asgi_application()  # sets Django up before the consumers import models

# by name, as INSTALLED_APPS and include("webui.urls") do: the project imports nothing from the web app
websocket_urlpatterns = import_string("webui.routing.websocket_urlpatterns")

application = ProtocolTypeRouter({
    "http": django_app,
    "websocket": AllowedHostsOriginValidator(URLRouter(websocket_urlpatterns)),
})
