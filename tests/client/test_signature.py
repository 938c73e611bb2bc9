"""queuelog_client.verify_signature, against signatures made as the dispatcher makes them."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from queuelog_client import SignatureError, verify_signature
from queuelog_client.signature import compute_signature, signature_header

SECRET = "qlsec_abcdef"
BODY = b'{"id":1,"payload":{"to":"\xc3\xa9"}}'
NOW = 1_800_000_000


def test_a_signature_made_for_the_body_verifies():
    header = signature_header(SECRET, NOW, BODY)
    assert verify_signature(SECRET, header, BODY, now=NOW)
    assert verify_signature(SECRET, header, BODY, tolerance=300, now=NOW + 300)


def test_the_signature_is_the_hmac_sha256_of_t_dot_body_under_the_secrets_utf8_bytes():
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert signature_header(SECRET, NOW, BODY) == f"t={NOW},v1={expected}"


def test_another_body_secret_or_signature_does_not_verify():
    header = signature_header(SECRET, NOW, BODY)
    assert not verify_signature(SECRET, header, BODY + b" ", now=NOW)
    assert not verify_signature("qlsec_other", header, BODY, now=NOW)
    assert not verify_signature(SECRET, header[:-1] + ("0" if header[-1] != "0" else "1"),
                                BODY, now=NOW)
    assert not verify_signature(SECRET, f"t={NOW},v1=é", BODY, now=NOW)


def test_a_stale_or_future_timestamp_does_not_verify():
    header = signature_header(SECRET, NOW, BODY)
    assert not verify_signature(SECRET, header, BODY, now=NOW + 301)
    assert not verify_signature(SECRET, header, BODY, now=NOW - 301)
    assert verify_signature(SECRET, header, BODY, tolerance=1000, now=NOW + 900)


def test_one_of_several_v1_signatures_may_match_and_other_schemes_are_skipped():
    good = signature_header(SECRET, NOW, BODY).split(",")[1]
    assert verify_signature(SECRET, f"t={NOW},v1=00,{good},v9=zz", BODY, now=NOW)


@pytest.mark.parametrize("header", [None, "", "garbage", "t=abc,v1=00", "v1=00", f"t={NOW}",
                                    f"t={NOW},t={NOW},v1=00", "t=-5,v1=00", "t=١٢,v1=00"])
def test_a_missing_or_malformed_header_raises_a_clear_error(header):
    with pytest.raises(SignatureError):
        verify_signature(SECRET, header, BODY, now=NOW)


def test_the_body_must_be_bytes():
    with pytest.raises(TypeError):
        verify_signature(SECRET, signature_header(SECRET, NOW, BODY), BODY.decode(), now=NOW)


def test_v2_is_the_hmac_sha256_of_t_job_id_attempt_and_body():
    expected = hmac.new(SECRET.encode(), f"{NOW}.42.3.".encode() + BODY,
                        hashlib.sha256).hexdigest()
    header = signature_header(SECRET, NOW, BODY, job_id=42, attempt=3)
    assert header == f"t={NOW},v1={compute_signature(SECRET, NOW, BODY)},v2={expected}"
    assert verify_signature(SECRET, header, BODY, now=NOW, job_id="42", attempt="3")


@pytest.mark.parametrize("job_id,attempt", [("43", "3"), ("42", "4"), ("042x", "3"),
                                            ("", "3"), ("٤٢", "3")])
def test_a_delivery_replayed_under_another_job_id_or_attempt_does_not_verify(job_id, attempt):
    header = signature_header(SECRET, NOW, BODY, job_id=42, attempt=3)
    assert not verify_signature(SECRET, header, BODY, now=NOW, job_id=job_id, attempt=attempt)


def test_with_the_job_id_a_header_stripped_to_v1_does_not_verify():
    header = signature_header(SECRET, NOW, BODY)  # t and v1 alone: valid for the body
    assert verify_signature(SECRET, header, BODY, now=NOW)
    assert not verify_signature(SECRET, header, BODY, now=NOW, job_id="42", attempt="3")


def test_the_job_id_and_attempt_go_together():
    header = signature_header(SECRET, NOW, BODY, job_id=42, attempt=3)
    with pytest.raises(TypeError):
        verify_signature(SECRET, header, BODY, now=NOW, job_id="42")
