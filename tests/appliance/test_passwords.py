"""Every place a password is set runs Django's validators (AUTH_PASSWORD_VALIDATORS: 12 characters at least, not
a common password, not all digits, not like the user name) and says what is wrong: /setup/, the panel's new user
and password reset, Django's admin, and `createsuperuser` without a terminal."""

import html
import re
import subprocess
import sys

import httpx
import pytest
from test_setup_page import TOKEN, token_file  # noqa: F401 (a fixture: a fresh appliance with its setup token)

STRONG = "a long passphrase 7"
WEAK = {  # password → what the page says, for the user "greenhouse"
    "short 1": "This password is too short. It must contain at least 12 characters.",
    "password1234": "This password is too common.",
    "839201746253": "This password is entirely numeric.",
    "greenhouse2025!": "The password is too similar to the username.",
}


@pytest.fixture
def staff(django_for_stack):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    User.objects.filter(username="greenhouse").delete()
    user, _ = User.objects.update_or_create(
        username="password-staff", defaults={"is_staff": True, "is_superuser": True, "is_active": True}
    )
    return user


def client(user):
    from django.test import Client

    c = Client(HTTP_HOST="127.0.0.1")
    c.force_login(user)
    return c


def says(response, message: str) -> bool:
    return message in html.unescape(response.content.decode())  # a Django test response or an httpx one


@pytest.mark.usefixtures("token_file")
def test_the_setup_page_refuses_each_weak_password_saying_why(stack):
    from django.contrib.auth import get_user_model

    with httpx.Client(base_url=stack.url, timeout=30) as browser:
        for password, message in WEAK.items():
            page = browser.get("/setup/")
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
            fields = {"token": TOKEN, "username": "greenhouse", "password1": password, "password2": password}
            r = browser.post("/setup/", data={"csrfmiddlewaretoken": csrf, **fields})
            assert r.status_code == 400 and says(r, message), (password, r.text)
        assert not get_user_model().objects.exists()
        fields = {"token": TOKEN, "username": "greenhouse", "password1": STRONG, "password2": STRONG}
        r = browser.post("/setup/", data={"csrfmiddlewaretoken": browser.cookies["csrftoken"], **fields})
        assert r.status_code == 302 and get_user_model().objects.get(username="greenhouse").check_password(STRONG)


def test_the_panel_refuses_a_weak_password_for_a_new_user_saying_why(staff):
    from django.contrib.auth import get_user_model

    for password, message in WEAK.items():
        r = client(staff).post(
            "/panel/users/", {"username": "greenhouse", "password1": password, "password2": password}
        )
        assert r.status_code == 400 and says(r, message), password
    assert not get_user_model().objects.filter(username="greenhouse").exists()


def test_a_password_reset_in_the_panel_or_the_admin_is_checked_the_same_way(staff):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("greenhouse", password=STRONG)
    for password, message in WEAK.items():
        r = client(staff).post(
            f"/panel/users/{user.pk}/password/", {"new_password1": password, "new_password2": password}
        )
        assert r.status_code == 400 and says(r, message), password
        r = client(staff).post(f"/admin/auth/user/{user.pk}/password/", {"password1": password, "password2": password})
        assert r.status_code == 200 and says(r, message), password
    user.refresh_from_db()
    assert user.check_password(STRONG)


def test_createsuperuser_without_a_terminal_refuses_a_weak_password(stack, django_for_stack):
    from django.contrib.auth import get_user_model

    get_user_model().objects.filter(username="greenhouse").delete()
    argv = [sys.executable, "-m", "django", "createsuperuser", "--noinput", "--username", "greenhouse"]
    argv += ["--email", "owner@example.org"]

    def run(password: str) -> subprocess.CompletedProcess:
        env = {**stack.env, "DJANGO_SUPERUSER_PASSWORD": password}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    weak = run("greenhouse2025!")
    assert weak.returncode != 0 and "The password is too similar to the username." in weak.stderr
    assert not get_user_model().objects.filter(username="greenhouse").exists()
    assert run(STRONG).returncode == 0
    assert get_user_model().objects.get(username="greenhouse").is_superuser
