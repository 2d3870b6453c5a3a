"""Signing in through the real form in Chromium; `/` sends a browser to the chat page or the login page."""

from .conftest import PASSWORD, shot, sign_in


def test_a_browser_at_the_root_without_a_session_lands_on_the_login_page(page, users):
    page.goto("/")
    assert "/login/" in page.url
    assert page.locator("h1").inner_text() == "Sign in"
    shot(page, "login")


def test_a_wrong_password_is_refused_with_a_clear_message(page, users):
    page.goto("/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD + "x")
    page.click("button[type=submit]")
    assert "do not match" in page.locator("p.error").inner_text()


def test_signing_in_and_out_round_trips(page, users):
    sign_in(page, "alice")
    assert page.locator("header").get_by_text("Panel").count() == 0  # not staff
    page.click("text=Sign out")
    page.wait_for_url("**/login/")
