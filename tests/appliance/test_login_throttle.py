"""Sign-in tries throttled in the stack's Redis (webui/throttle.py): five wrong passwords for a user name, or from an
address, lock it, the right password refused too with a 429 saying when to retry, until the lockout ends or an
administrator lifts it on the Users page. /login/, /admin/login/ and /setup/ share the counts. (Off-loopback
clients through a network namespace: test_key_throttle.py.)"""

import html
import time
from pathlib import Path

import pytest

STRONG = "a long passphrase 7"


@pytest.fixture
def users(no_failures):
    """A user and an administrator."""
    from django.contrib.auth import get_user_model

    User = get_user_model()
    for name in ("gardener", "warden"):
        User.objects.filter(username=name).delete()
    gardener = User.objects.create_user("gardener", password=STRONG)
    warden = User.objects.create_superuser("warden", password=STRONG)
    return gardener, warden


@pytest.fixture
def short_lockout(django_for_stack):
    from django.conf import settings
    from django.test import override_settings

    with override_settings(RKMOJO={**settings.RKMOJO, "LOCKOUT": 2.0}):
        yield


def sign_in(address: str, username: str, password: str, path: str = "/login/"):
    from django.test import Client

    c = Client(REMOTE_ADDR=address, HTTP_HOST="127.0.0.1")
    return c.post(path, {"username": username, "password": password})


def page(r) -> str:
    return html.unescape(r.content.decode())


def test_the_right_password_is_refused_while_locked_and_accepted_after_the_lockout(users, short_lockout):
    for _ in range(5):
        r = sign_in("10.20.0.1", "gardener", "not the password")
        assert r.status_code == 200 and "do not match" in page(r)
    r = sign_in("10.20.0.1", "gardener", STRONG)
    assert r.status_code == 429 and r["Retry-After"] == "2" and "_auth_user_id" not in r.client.session
    assert "Too many failed sign-ins from this address; try again in 2 seconds." in page(r)  # the user name too
    time.sleep(2.2)
    assert sign_in("10.20.0.1", "gardener", STRONG).status_code == 302


def test_a_locked_user_name_is_refused_from_anywhere_until_an_administrator_lifts_the_lock(users):
    from django.test import Client

    _, warden = users
    for n in range(5):  # one try from each of five addresses: no address is locked, the user name is
        sign_in(f"10.20.1.{n}", "Gardener", "not the password")  # the count is case-blind
    r = sign_in("10.20.2.1", "gardener", STRONG)
    assert r.status_code == 429 and "for this user name; try again in 15 minutes" in page(r)

    admin = Client(enforce_csrf_checks=True, HTTP_HOST="127.0.0.1")
    admin.force_login(warden)
    users_page = page(admin.get("/panel/users/"))
    assert 'data-lock="signin:user:gardener"' in users_page and "<strong>locked</strong>, 15 minutes left" in users_page
    assert admin.post("/panel/users/locks/clear/", {"subject": "signin:user:gardener"}).status_code == 403  # no CSRF
    assert sign_in("10.20.2.1", "gardener", STRONG).status_code == 429
    csrf = admin.cookies["csrftoken"].value
    r = admin.post("/panel/users/locks/clear/", {"subject": "signin:user:gardener", "csrfmiddlewaretoken": csrf})
    assert r.status_code == 302 and 'data-lock="signin:user:gardener"' not in page(admin.get("/panel/users/"))
    assert sign_in("10.20.2.1", "gardener", STRONG).status_code == 302


def test_an_address_is_locked_whichever_user_names_it_tries(users):
    from webui import throttle

    for n in range(5):
        sign_in("10.20.3.1", f"guess-{n}", "not the password")
    r = sign_in("10.20.3.1", "gardener", STRONG)
    assert r.status_code == 429 and "from this address" in page(r)
    assert sign_in("10.20.3.2", "gardener", STRONG).status_code == 302  # the user name is not locked
    assert "signin:address:10.20.3.2" not in [c.subject.name for c in throttle.counts()]  # a right try is forgiven


def test_the_admin_login_counts_with_the_login_page(users):
    for path in ("/login/", "/admin/login/") * 2 + ("/admin/login/",):
        sign_in("10.20.4.1", "warden", "not the password", path)
    r = sign_in("10.20.4.1", "warden", STRONG, "/admin/login/")
    assert r.status_code == 429 and int(r["Retry-After"]) > 890 and "Too many failed sign-ins" in page(r)
    assert sign_in("10.20.4.2", "warden", STRONG).status_code == 429  # the user name, from anywhere


def test_wrong_setup_tokens_lock_the_address(users):
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webui import throttle

    get_user_model().objects.all().delete()
    (settings.DATA_DIR / "setup-done").unlink(missing_ok=True)
    token = Path(settings.RKMOJO["SETUP_TOKEN_FILE"])
    token.write_text("Zq3vR8kTn2WcY5hLp7Xa\n")
    c = Client(REMOTE_ADDR="10.20.5.1", HTTP_HOST="127.0.0.1")
    fields = {"username": "owner", "password1": STRONG, "password2": STRONG}
    try:
        for n in range(5):
            assert c.post("/setup/", {"token": f"guess-{n}", **fields}).status_code == 403
        r = c.post("/setup/", {"token": "Zq3vR8kTn2WcY5hLp7Xa", **fields})
        assert r.status_code == 429 and "from this address" in page(r) and not get_user_model().objects.exists()
        throttle.clear(throttle.Subject.parse("signin:address:10.20.5.1"))
        assert c.post("/setup/", {"token": "Zq3vR8kTn2WcY5hLp7Xa", **fields}).status_code == 302
    finally:
        token.unlink(missing_ok=True)
