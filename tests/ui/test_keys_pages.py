"""Fair share and ordered keys (contract §16) in the dashboard, through Flask's test client:
the types page shows and sets each type's key modes, the overview lists the ordered keys a
failed job blocks, and a job page lets the admin unblock its key."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from flask.testing import FlaskClient
from markupsafe import escape

from app.core.clock import ManualClock
from app.ui import routes
from tests.conftest import Api, Key
from tests.ui.conftest import post_form, without_live_script

HOSTILE_KEY = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def _type(client: FlaskClient, admin: Key, job_type: str = "email") -> dict[str, Any]:
    shown: dict[str, Any] = client.get(f"/types/{job_type}", headers=admin.headers).get_json()
    return shown


def _modes(client: FlaskClient, admin: Key, job_type: str = "email") -> tuple[Any, Any, Any]:
    shown = _type(client, admin, job_type)
    return shown["fairness"], shown["ordering"], shown["on_failure"]


def _selected(page: str, field: str, row: int = 1) -> str:
    """The option the types page's `row`-th key modes form has selected for `field`."""
    select = re.search(rf'<select id="{field}-{row}" name="{field}">(.*?)</select>', page,
                       re.DOTALL)
    assert select is not None, f"no {field} select in row {row}"
    chosen = re.findall(r'<option value="([^"]+)" selected>', select.group(1))
    assert len(chosen) == 1, chosen
    return chosen[0]


def _block_a_key(api: Api, producer: Key, worker: Key, key: str,
                 job_type: str = "email") -> tuple[int, int]:
    """A failed job that blocks `key` of an ordered type (on_failure block), and the job of
    the key it holds back; the type's modes must be set first."""
    failed = api.enqueue(producer, type=job_type, concurrency_key=key,
                         max_retries=0).get_json()["id"]
    held = api.enqueue(producer, type=job_type, concurrency_key=key).get_json()["id"]
    claimed = api.claim(worker, types=[job_type]).get_json()
    assert claimed["id"] == failed
    answer = api.fail(worker, failed, error="ledger rejected", lease_token=claimed["lease_token"])
    assert answer.get_json()["status"] == "failed"
    return int(failed), int(held)


def _order_and_block(signed_in: FlaskClient, job_type: str = "email") -> None:
    answer = post_form(signed_in, "/ui/types", f"/ui/types/{job_type}/keys",
                       {"fairness": "off", "ordering": "key", "on_failure": "block"})
    assert answer.status_code == 302


def test_the_types_page_shows_each_types_key_modes_and_its_blocked_keys(
        signed_in: FlaskClient) -> None:
    page = signed_in.get("/ui/types").text
    # Rows in type order: email, pdf, sync; a type never changed is off, off, skip.
    for row in (1, 2, 3):
        assert (_selected(page, "fairness", row), _selected(page, "ordering", row),
                _selected(page, "on_failure", row)) == ("off", "off", "skip")
    assert page.count("0 blocked keys") == 3
    assert page.count('action="/ui/types/email/keys"') == 1


def test_the_key_modes_form_sets_fairness_ordering_and_on_failure_as_the_api_does(
        signed_in: FlaskClient, client: FlaskClient, admin: Key) -> None:
    answer = post_form(signed_in, "/ui/types", "/ui/types/email/keys",
                       {"fairness": "key", "ordering": "key", "on_failure": "block"})
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/types"
    assert _modes(client, admin) == ("key", "key", "block")
    assert _modes(client, admin, "pdf") == (None, None, "skip")
    page = signed_in.get("/ui/types").text
    assert "email: key modes changed." in page
    assert (_selected(page, "fairness"), _selected(page, "ordering"),
            _selected(page, "on_failure")) == ("key", "key", "block")

    # "off" clears a mode; a field left out is left as it is.
    post_form(signed_in, "/ui/types", "/ui/types/email/keys", {"fairness": "off"})
    assert _modes(client, admin) == (None, "key", "block")
    post_form(signed_in, "/ui/types", "/ui/types/email/keys",
              {"ordering": "off", "on_failure": "skip"})
    assert _modes(client, admin) == (None, None, "skip")


def test_turning_ordering_on_in_the_form_holds_a_keys_backlog_as_the_api_does(
        signed_in: FlaskClient, api: Api, producer: Key, admin: Key) -> None:
    ids = [api.enqueue(producer, type="email", concurrency_key="acct-7").get_json()["id"]
           for _ in range(3)]
    post_form(signed_in, "/ui/types", "/ui/types/email/keys", {"ordering": "key"})
    assert [api.get(admin, i).get_json()["status"] for i in ids] \
        == ["pending", "waiting", "waiting"]


@pytest.mark.parametrize(("form", "said"), [
    ({"fairness": "tenant"}, "email: fairness: Must be one of: off, key."),
    ({"ordering": "true"}, "email: ordering: Must be one of: off, key."),
    ({"ordering": "null"}, "email: ordering: Must be one of: off, key."),
    ({"on_failure": "stop"}, "email: on_failure: Must be one of: skip, block."),
    ({"on_failure": "off"}, "email: on_failure: Must be one of: skip, block."),
    ({"fairness": "key", "ordering": "KEY"}, "email: ordering: Must be one of: off, key."),
])
def test_a_bad_key_mode_is_a_message_and_changes_nothing(
        signed_in: FlaskClient, client: FlaskClient, admin: Key, form: dict[str, str],
        said: str) -> None:
    answer = post_form(signed_in, "/ui/types", "/ui/types/email/keys", form)
    assert answer.status_code == 302
    page = signed_in.get("/ui/types")
    assert page.status_code == 200
    assert f'<li class="error">{html.escape(said)}</li>' in page.text
    assert _modes(client, admin) == (None, None, "skip")


def test_the_key_modes_of_an_unknown_type_are_a_message(signed_in: FlaskClient) -> None:
    answer = post_form(signed_in, "/ui/types", "/ui/types/nosuch/keys", {"ordering": "key"})
    assert answer.status_code == 302
    assert "not in QUEUELOG_JOB_TYPES" in signed_in.get("/ui/types").text


def test_the_key_modes_form_needs_its_csrf_token(
        signed_in: FlaskClient, client: FlaskClient, admin: Key) -> None:
    for token in ({}, {"csrf_token": "forged"}):
        answer = signed_in.post("/ui/types/email/keys", data={"ordering": "key", **token})
        assert answer.status_code == 400 and "CSRF" in answer.text
    assert _modes(client, admin) == (None, None, "skip")


def test_the_overview_says_none_while_no_key_is_blocked(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    # An ordered type under skip: a failure lets the key go on, and blocks nothing.
    post_form(signed_in, "/ui/types", "/ui/types/email/keys", {"ordering": "key"})
    failed = api.enqueue(producer, type="email", concurrency_key="k",
                         max_retries=0).get_json()["id"]
    claimed = api.claim(worker).get_json()
    api.fail(worker, failed, lease_token=claimed["lease_token"])
    page = signed_in.get("/ui/").text
    assert '<h2 id="blocked-keys-heading">Blocked keys</h2>' in page
    assert "None: no failed job blocks an ordered key." in page
    assert 'id="blocked-keys"' not in page


def test_the_overview_lists_a_blocked_key_with_a_link_to_its_failed_job(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key,
        clock: ManualClock) -> None:
    _order_and_block(signed_in)
    failed, _held = _block_a_key(api, producer, worker, "acct-7")
    clock.advance(180)

    page = signed_in.get("/ui/").text
    table = page.split('<table id="blocked-keys">', 1)[1].split("</table>", 1)[0]
    row = table.split("<tbody>", 1)[1]
    assert '<th scope="row">email</th>' in row
    assert "<code>acct-7</code>" in row
    assert f'<a href="/ui/jobs/{failed}">{failed}</a>' in row
    assert " UTC</time>" in row and "(3 min ago)" in row
    assert "None: no failed job blocks" not in page
    types_page = signed_in.get("/ui/types").text
    assert '#blocked-keys-heading" class="blocked">1 blocked key</a>' in types_page
    assert types_page.count("0 blocked keys") == 2


def test_retrying_the_failed_job_from_its_page_unblocks_the_key(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    _order_and_block(signed_in)
    failed, held = _block_a_key(api, producer, worker, "acct-7")
    job_page = f"/ui/jobs/{failed}"
    assert "key_blocked" in signed_in.get(job_page).text

    post_form(signed_in, job_page, f"{job_page}/retry")
    assert api.get(admin, failed).get_json()["status"] == "pending"
    assert "None: no failed job blocks an ordered key." in signed_in.get("/ui/").text
    claimed = api.claim(worker).get_json()
    assert claimed["id"] == failed
    api.complete(worker, failed, lease_token=claimed["lease_token"])
    assert api.claim(worker).get_json()["id"] == held


def test_a_failed_job_that_blocks_its_key_has_a_cancel_button_that_passes_the_turn_on(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    _order_and_block(signed_in)
    failed, held = _block_a_key(api, producer, worker, "acct-7")
    job_page = f"/ui/jobs/{failed}"
    assert f'action="{job_page}/cancel"' in signed_in.get(job_page).text

    post_form(signed_in, job_page, f"{job_page}/cancel")
    assert api.get(admin, failed).get_json()["status"] == "cancelled"
    assert "Cancelled." in signed_in.get(job_page).text
    assert api.claim(worker).get_json()["id"] == held
    # A failed job that blocks no key (its type is not ordered) offers only Retry, as before.
    loose = api.enqueue(producer, type="pdf", max_retries=0).get_json()["id"]
    claimed = api.claim(worker, types=["pdf"]).get_json()
    api.fail(worker, loose, lease_token=claimed["lease_token"])
    assert f'action="/ui/jobs/{loose}/cancel"' not in signed_in.get(f"/ui/jobs/{loose}").text


def test_the_overview_lists_the_longest_blocked_keys_first_and_says_how_many_there_are(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "BLOCKED_KEYS_SHOWN", 2)
    _order_and_block(signed_in, "email")
    _order_and_block(signed_in, "sync")
    blocked = []
    for key, job_type in (("k-old", "sync"), ("k-mid", "email"), ("k-new", "email")):
        blocked.append(_block_a_key(api, producer, worker, key, job_type)[0])
        clock.advance(60)
    page = signed_in.get("/ui/").text
    table = page.split('<table id="blocked-keys">', 1)[1].split("</table>", 1)[0]
    assert "the 2 longest blocked of 3" in table
    shown = [int(n) for n in re.findall(r'<a href="/ui/jobs/(\d+)">', table)]
    assert shown == blocked[:2]
    assert "<code>k-old</code>" in table and "k-new" not in table


def test_a_key_named_like_markup_is_shown_as_text(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    _order_and_block(signed_in)
    failed, held = _block_a_key(api, producer, worker, HOSTILE_KEY)
    for page in ("/ui/", f"/ui/jobs/{failed}", f"/ui/jobs/{held}"):
        text = signed_in.get(page).text
        assert "<script" not in without_live_script(text) and "<img" not in text, page
        assert str(escape(HOSTILE_KEY)) in text, page
