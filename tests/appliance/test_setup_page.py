"""/setup/ takes the board's one-time setup token and creates the first administrator, once."""

import re

import httpx
import pytest

TOKEN = "Zq3vR8kTn2WcY5hLp7Xa"


@pytest.fixture
def token_file(django_for_stack, stack):
    """A fresh appliance: the token file the firstboot role writes, no user, no setup-done marker."""
    from django.contrib.auth import get_user_model

    get_user_model().objects.all().delete()
    (stack.data / "setup-done").unlink(missing_ok=True)
    path = stack.base / "setup-token"
    path.write_text(TOKEN + "\n")
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def browser(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        yield c


def post_form(browser, **fields) -> httpx.Response:
    page = browser.get("/setup/")
    assert page.status_code == 200, page.text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return browser.post("/setup/", data={"csrfmiddlewaretoken": csrf, **fields})


def superusers() -> list[str]:
    from django.contrib.auth import get_user_model

    return list(get_user_model().objects.filter(is_superuser=True, is_staff=True).values_list("username", flat=True))


def test_the_page_asks_for_the_token_a_name_and_a_password(token_file, browser):
    page = browser.get("/setup/")
    assert page.status_code == 200
    for field in ("token", "username", "password1", "password2"):
        assert f'name="{field}"' in page.text


def test_a_wrong_token_creates_nobody(token_file, browser):
    r = post_form(
        browser,
        token="not-the-token",
        username="admin",
        password1="a long passphrase 7",
        password2="a long passphrase 7",
    )
    assert r.status_code == 403 and "not the setup token" in r.text
    assert superusers() == []


def test_passwords_that_differ_create_nobody(token_file, browser):
    r = post_form(browser, token=TOKEN, username="admin", password1="a long passphrase 7", password2="another one 8")
    assert r.status_code == 400
    assert superusers() == []


def test_the_token_creates_the_administrator_once(token_file, browser, stack):
    r = post_form(
        browser, token=TOKEN, username="admin", password1="a long passphrase 7", password2="a long passphrase 7"
    )
    assert r.status_code == 302 and r.headers["location"] == "/panel/"
    assert superusers() == ["admin"]
    assert (stack.data / "setup-done").exists()  # the next boot removes the token file

    from django.contrib.auth import get_user_model

    assert get_user_model().objects.get(username="admin").check_password("a long passphrase 7")
    again = browser.get("/setup/")
    assert again.status_code == 410 and "admin pages" in again.text
    r = browser.post(
        "/setup/",
        data={
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            "token": TOKEN,
            "username": "second",
            "password1": "x" * 12,
            "password2": "x" * 12,
        },
    )
    assert r.status_code == 410
    assert superusers() == ["admin"]


def test_the_page_is_closed_once_an_administrator_exists_however_made(token_file, browser):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("made-by-cli", password="a long passphrase 7")
    assert browser.get("/setup/").status_code == 410


def test_without_a_token_file_there_is_no_setup_page(token_file, browser):
    token_file.unlink()
    assert browser.get("/setup/").status_code == 404


def test_the_page_stays_closed_after_the_next_boot_removed_the_spent_token(token_file, browser):
    r = post_form(
        browser, token=TOKEN, username="admin", password1="a long passphrase 7", password2="a long passphrase 7"
    )
    assert r.status_code == 302
    token_file.unlink()  # what rkmojo-firstboot does at the next boot
    again = browser.get("/setup/")
    assert again.status_code == 410 and "admin pages" in again.text
