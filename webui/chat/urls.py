"""The chat page's URLs, under /chat/."""
urlpatterns: list = []
