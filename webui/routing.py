from django.urls import path

from .consumers import ChatConsumer
from .panel.live import LiveConsumer
from .panel.models_page import JobConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    path("ws/panel/live/", LiveConsumer.as_asgi()),
    path("ws/panel/job/<str:worker>/<str:id>/", JobConsumer.as_asgi()),
]
