"""The admin panel's URLs, under /panel/ (staff only)."""
urlpatterns: list = []
