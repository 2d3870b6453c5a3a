from django.urls import path

from .consumers import ChatConsumer
from .panel.live import LiveConsumer
from .panel.models_page import JobConsumer
from .socket_auth import SessionBound

# every signed-in socket ends with its session (close code 4401); the panel's also when its user loses staff
websocket_urlpatterns = [
    path("ws/chat/", SessionBound(ChatConsumer.as_asgi())),
    path("ws/panel/live/", SessionBound(LiveConsumer.as_asgi(), staff=True)),
    path("ws/panel/job/<str:worker>/<str:id>/", SessionBound(JobConsumer.as_asgi(), staff=True)),
]
