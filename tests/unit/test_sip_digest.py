"""HTTP Digest for SIP: the RFC worked examples, client/server round trips, and what must be refused."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.transports.sip.digest import (
    ClientCredentials,
    DigestAuthenticator,
    Verdict,
    authorization_for,
    parse_auth,
)
from parley.transports.sip.message import SipError

URI = "sip:bob@biloxi.example.com"
SOURCE = "192.0.2.7"  # where the request came from


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def server(
    clock: Clock | None = None, *, algorithm: str = "MD5", nonce_ttl_s: float = 300
) -> DigestAuthenticator:
    return DigestAuthenticator(
        "biloxi.example.com", "bob", "zanzibar", b"0123456789abcdef", nonce_ttl_s, algorithm=algorithm,
        clock=clock or Clock(),
    )  # fmt: skip


def test_rfc_2617_worked_example_gives_the_documented_response() -> None:
    # RFC 2617 section 3.5
    challenge = (
        'Digest realm="testrealm@host.com", qop="auth,auth-int", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", '
        'opaque="5ccc069c403ebaf9f0171e9517f40e41"'
    )
    value = authorization_for(
        challenge, "GET", "/dir/index.html", "Mufasa", "Circle Of Life", cnonce="0a4f113b"
    )
    expected = {
        "username": "Mufasa",
        "realm": "testrealm@host.com",
        "nonce": "dcd98b7102dd2f0e8b11d0f600bfb0c093",
        "uri": "/dir/index.html",
        "qop": "auth",
        "nc": "00000001",
        "cnonce": "0a4f113b",
        "response": "6629fae49393a05397450978507c4ef1",
        "opaque": "5ccc069c403ebaf9f0171e9517f40e41",
    }
    params = parse_auth(value)[1]
    assert {name: params.get(name) for name in expected} == expected


@pytest.mark.parametrize(
    ("algorithm", "response"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc_7616_worked_examples_give_the_documented_responses(algorithm: str, response: str) -> None:
    # RFC 7616 section 3.9.1
    challenge = (
        f'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm={algorithm}, '
        'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", '
        'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
    )
    value = authorization_for(
        challenge, "GET", "/dir/index.html", "Mufasa", "Circle of Life",
        cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
    )  # fmt: skip
    params = parse_auth(value)[1]
    assert (params["response"], params["algorithm"]) == (response, algorithm)


def test_a_challenge_without_qop_is_answered_the_rfc_2069_way() -> None:
    value = authorization_for('Digest realm="r", nonce="n"', "INVITE", URI, "bob", "pw")
    params = parse_auth(value)[1]
    ha1 = hashlib.md5(b"bob:r:pw").hexdigest()
    ha2 = hashlib.md5(f"INVITE:{URI}".encode()).hexdigest()
    assert params["response"] == hashlib.md5(f"{ha1}:n:{ha2}".encode()).hexdigest()
    assert "qop" not in params and "nc" not in params and "cnonce" not in params


def test_the_challenge_offers_md5_with_qop_auth_and_marks_stale_when_asked() -> None:
    scheme, params = parse_auth(server().challenge(SOURCE))
    assert scheme == "Digest"
    assert (params["realm"], params["algorithm"], params["qop"]) == ("biloxi.example.com", "MD5", "auth")
    assert "stale" not in params
    assert parse_auth(server().challenge(SOURCE, stale=True))[1]["stale"] == "true"
    assert server().challenge(SOURCE) != server().challenge(SOURCE)  # every nonce is fresh


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256", "MD5-sess", "SHA-256-sess"])
def test_client_credentials_satisfy_the_server(algorithm: str) -> None:
    auth = server(algorithm=algorithm)
    value = authorization_for(auth.challenge(SOURCE), "INVITE", URI, "bob", "zanzibar", nc=3)
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.OK


def test_credentials_without_qop_are_bad_even_with_the_right_password() -> None:
    # RFC 2069 style: no nonce count, so nothing would tell a replay from the original.
    auth = server()
    challenge = auth.challenge(SOURCE).replace(', qop="auth"', "")
    value = authorization_for(challenge, "BYE", URI, "bob", "zanzibar")
    assert "qop" not in parse_auth(value)[1]
    assert auth.verify(value, "BYE", URI, SOURCE) is Verdict.BAD


def test_each_nonce_count_is_taken_once_and_must_go_up() -> None:
    auth = server()
    challenge = auth.challenge(SOURCE)
    first = authorization_for(challenge, "INVITE", URI, "bob", "zanzibar", nc=1)
    assert auth.verify(first, "INVITE", URI, SOURCE) is Verdict.OK
    assert auth.verify(first, "INVITE", URI, SOURCE) is Verdict.STALE  # a replay: the same nonce and nc
    third = authorization_for(challenge, "INVITE", URI, "bob", "zanzibar", nc=3)
    assert auth.verify(third, "INVITE", URI, SOURCE) is Verdict.OK  # RFC 7616: counts may skip
    second = authorization_for(challenge, "INVITE", URI, "bob", "zanzibar", nc=2)
    assert auth.verify(second, "INVITE", URI, SOURCE) is Verdict.STALE  # ... but never go back
    zero = authorization_for(challenge, "INVITE", URI, "bob", "zanzibar", nc=1).replace(
        "nc=00000001", "nc=00000000"
    )
    assert auth.verify(zero, "INVITE", URI, SOURCE) is Verdict.BAD


def test_a_nonce_answers_only_from_the_address_it_was_issued_to() -> None:
    auth = server()
    value = authorization_for(auth.challenge(SOURCE), "INVITE", URI, "bob", "zanzibar")
    assert auth.verify(value, "INVITE", URI, "198.51.100.9") is Verdict.BAD
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.OK


def test_the_live_nonces_are_bounded_and_a_forgotten_one_is_stale() -> None:
    clock = Clock()
    auth = DigestAuthenticator(
        "biloxi.example.com", "bob", "zanzibar", b"0123456789abcdef", max_nonces=3, clock=clock
    )
    oldest = auth.challenge(SOURCE)
    for _ in range(3):
        auth.challenge("198.51.100.9")
    assert len(auth._last_nc) == 3
    value = authorization_for(oldest, "INVITE", URI, "bob", "zanzibar")
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.STALE  # evicted: the client takes a new one
    clock.now += 301
    auth.challenge(SOURCE)
    assert len(auth._last_nc) == 1  # expired ones are let go as new ones are minted


@pytest.mark.parametrize(
    ("user", "password", "method", "uri"),
    [
        ("bob", "wrong", "INVITE", URI),
        ("alice", "zanzibar", "INVITE", URI),
        ("bob", "zanzibar", "BYE", URI),  # digest made for another method
        ("bob", "zanzibar", "INVITE", "sip:carol@chicago.example.com"),  # ... or another request-URI
    ],
)
def test_wrong_credentials_are_bad(user: str, password: str, method: str, uri: str) -> None:
    auth = server()
    value = authorization_for(auth.challenge(SOURCE), method, uri, user, password)
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.BAD


def test_a_tampered_nonce_or_one_minted_with_another_secret_is_bad() -> None:
    auth = server()
    challenge = auth.challenge(SOURCE)
    nonce = parse_auth(challenge)[1]["nonce"]
    stamp, salt, mac = nonce.split(".")
    later = f"{int(stamp, 16) + 10_000:x}.{salt}.{mac}"  # pushing the expiry back breaks the HMAC
    for forged in (
        later,
        nonce[:-1] + ("0" if nonce[-1] != "0" else "1"),
        "dcd98b7102dd2f0e8b11d0f600bfb0c093",
    ):
        value = authorization_for(challenge.replace(nonce, forged), "INVITE", URI, "bob", "zanzibar")
        assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.BAD
    other = DigestAuthenticator("biloxi.example.com", "bob", "zanzibar", b"another secret", clock=Clock())
    value = authorization_for(other.challenge(SOURCE), "INVITE", URI, "bob", "zanzibar")
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.BAD


def test_an_expired_nonce_is_stale_only_when_the_password_was_right() -> None:
    clock = Clock()
    auth = server(clock, nonce_ttl_s=300)
    challenge = auth.challenge(SOURCE)
    right = authorization_for(challenge, "INVITE", URI, "bob", "zanzibar")
    wrong = authorization_for(challenge, "INVITE", URI, "bob", "guess")
    clock.now += 299
    assert auth.verify(right, "INVITE", URI, SOURCE) is Verdict.OK
    clock.now += 2
    assert auth.verify(right, "INVITE", URI, SOURCE) is Verdict.STALE
    assert auth.verify(wrong, "INVITE", URI, SOURCE) is Verdict.BAD


def test_a_nonce_from_the_future_is_bad() -> None:
    clock = Clock()
    auth = server(clock)
    value = authorization_for(auth.challenge(SOURCE), "INVITE", URI, "bob", "zanzibar")
    clock.now -= 3600
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.BAD


def test_credentials_in_another_realm_or_algorithm_or_with_a_broken_qop_are_bad() -> None:
    auth = server()
    value = authorization_for(auth.challenge(SOURCE), "INVITE", URI, "bob", "zanzibar")
    assert (
        auth.verify(value.replace('realm="biloxi.example.com"', 'realm="elsewhere"'), "INVITE", URI, SOURCE)
        is Verdict.BAD
    )
    assert (
        auth.verify(value.replace("algorithm=MD5", "algorithm=SHA-256"), "INVITE", URI, SOURCE) is Verdict.BAD
    )
    assert auth.verify(value.replace("qop=auth", "qop=auth-int"), "INVITE", URI, SOURCE) is Verdict.BAD
    assert auth.verify(value.replace("nc=00000001", "nc=1"), "INVITE", URI, SOURCE) is Verdict.BAD
    assert auth.verify(value.replace("Digest ", "Basic "), "INVITE", URI, SOURCE) is Verdict.BAD


def test_a_user_name_with_quotes_and_backslashes_survives_the_round_trip() -> None:
    auth = DigestAuthenticator('a "quoted" realm', 'b\\o"b', "pw", clock=Clock())
    value = authorization_for(auth.challenge(SOURCE), "INVITE", URI, 'b\\o"b', "pw")
    assert parse_auth(value)[1]["username"] == 'b\\o"b'
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.OK


def test_auth_header_parsing_handles_commas_and_escapes_inside_quotes() -> None:
    scheme, params = parse_auth(
        'Digest   realm="a, b\\"c\\\\",NONCE="n,1" ,  qop="auth,auth-int", algorithm=MD5,, stale=TRUE'
    )
    assert scheme == "Digest"
    assert params == {
        "realm": 'a, b"c\\',
        "nonce": "n,1",
        "qop": "auth,auth-int",
        "algorithm": "MD5",
        "stale": "TRUE",
    }


@pytest.mark.parametrize(
    "value",
    ['Digest realm="open', "Digest realm", "Digest realm=", 'Digest realm="a" x', "Digest a=1, a=2", "",
     "Dig=est", "Digest realm=a b"],
)  # fmt: skip
def test_malformed_auth_headers_raise_sip_error(value: str) -> None:
    with pytest.raises(SipError):
        parse_auth(value)


@pytest.mark.parametrize(
    ("challenge", "message"),
    [
        ('Digest realm="r", nonce="n", algorithm=SHA-512-256', "unsupported digest algorithm"),
        ('Digest realm="r", nonce="n", qop="auth-int"', "only auth is supported"),
        ('Basic realm="r"', "unsupported authentication scheme"),
        ('Digest realm="r"', "without realm or nonce"),
        ('Digest realm="r", nonce="n", algorithm=MD5-sess', "without qop"),
    ],
)
def test_challenges_we_cannot_answer_raise_sip_error_saying_why(challenge: str, message: str) -> None:
    with pytest.raises(SipError, match=message):
        authorization_for(challenge, "INVITE", URI, "bob", "pw")


def test_an_unsupported_server_algorithm_is_refused_at_construction() -> None:
    with pytest.raises(SipError, match="unsupported digest algorithm"):
        DigestAuthenticator("r", "u", "p", algorithm="SHA-512")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_verify_never_raises_on_arbitrary_input(value: str) -> None:
    auth = server()
    assert auth.verify(value, "INVITE", URI, SOURCE) is Verdict.BAD
    assert auth.verify("Digest " + value, "INVITE", URI, SOURCE) is Verdict.BAD


def test_client_credentials_pinned_to_a_realm_answer_only_there() -> None:
    credentials = ClientCredentials("bob", "zanzibar", "biloxi.example.com")
    elsewhere = 'Digest realm="atlanta.example.com", nonce="n1", qop="auth"'
    home = server().challenge(SOURCE)
    value = credentials.answer([elsewhere, home], "INVITE", URI)
    assert parse_auth(value)[1]["realm"] == "biloxi.example.com"
    with pytest.raises(SipError, match=r"realm 'atlanta\.example\.com' is not 'biloxi\.example\.com'"):
        credentials.answer([elsewhere], "INVITE", URI)
    with pytest.raises(SipError, match="no challenge"):
        credentials.answer([], "INVITE", URI)
    assert "zanzibar" not in repr(credentials)
    anywhere = ClientCredentials("bob", "zanzibar")
    assert parse_auth(anywhere.answer([elsewhere], "INVITE", URI))[1]["realm"] == "atlanta.example.com"
