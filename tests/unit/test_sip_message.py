"""SIP messages: parsing, serialising, value types, responses, Via bookkeeping and stream framing."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.transports.sip.framing import StreamFramer
from parley.transports.sip.message import (
    Headers,
    NameAddr,
    SipError,
    SipRequest,
    SipResponse,
    SipUri,
    Via,
    fix_via_received,
    make_response,
    new_branch,
    new_call_id,
    new_tag,
    parse_message,
    response_destination,
)

SDP = (
    b"v=0\r\n"
    b"o=alice 2890844526 2890844526 IN IP4 client.atlanta.example.com\r\n"
    b"s=-\r\n"
    b"c=IN IP4 192.0.2.101\r\n"
    b"t=0 0\r\n"
    b"m=audio 49172 RTP/AVP 0 8 101\r\n"
    b"a=rtpmap:0 PCMU/8000\r\n"
    b"a=rtpmap:8 PCMA/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\n"
    b"a=fmtp:101 0-15\r\n"
    b"a=ptime:20\r\n"
    b"a=sendrecv\r\n"
)

INVITE = (
    b"INVITE sip:bob@biloxi.example.com SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP client.atlanta.example.com:5060;branch=z9hG4bK74bf9;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b"From: Alice <sip:alice@atlanta.example.com>;tag=9fxced76sl\r\n"
    b"To: Bob <sip:bob@biloxi.example.com>\r\n"
    b"Call-ID: 3848276298220188511@atlanta.example.com\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"Contact: <sip:alice@client.atlanta.example.com;transport=udp>\r\n"
    b"Allow: INVITE, ACK, CANCEL, BYE, OPTIONS\r\n"
    b"Content-Type: application/sdp\r\n"
    b"Content-Length: 255\r\n"
    b"\r\n" + SDP
)

RINGING = (
    b"SIP/2.0 180 Ringing\r\n"
    b"Via: SIP/2.0/UDP client.atlanta.example.com:5060;branch=z9hG4bK74bf9;received=192.0.2.101\r\n"
    b"From: Alice <sip:alice@atlanta.example.com>;tag=9fxced76sl\r\n"
    b"To: Bob <sip:bob@biloxi.example.com>;tag=8321234356\r\n"
    b"Call-ID: 3848276298220188511@atlanta.example.com\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"Contact: <sip:bob@client.biloxi.example.com>\r\n"
    b"Content-Length: 0\r\n"
    b"\r\n"
)

OPTIONS = (
    "OPTIONS sip:carol@chicago.example.com SIP/2.0\r\n"
    "Via: SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bKhjhs8ass877\r\n"
    "Max-Forwards: 70\r\n"
    "To: <sip:carol@chicago.example.com>\r\n"
    "From: Alice <sip:alice@atlanta.example.com>;tag=1928301774\r\n"
    "Call-ID: a84b4c76e66710\r\n"
    "CSeq: 63104 OPTIONS\r\n"
    "{extra}"
    "\r\n"
)


def options(extra: str = "", body: bytes = b"") -> bytes:
    return OPTIONS.format(extra=extra).encode() + body


def request(data: bytes) -> SipRequest:
    message = parse_message(data)
    assert isinstance(message, SipRequest)
    return message


# --- parsing -----------------------------------------------------------------------------------------


def test_invite_with_sdp_body_parses_into_request_line_headers_and_body() -> None:
    invite = request(INVITE)
    assert (invite.method, invite.uri) == ("INVITE", "sip:bob@biloxi.example.com")
    assert invite.body == SDP
    assert invite.call_id == "3848276298220188511@atlanta.example.com"
    assert invite.cseq == (1, "INVITE")
    assert invite.from_tag == "9fxced76sl"
    assert invite.to_tag is None
    assert invite.branch == "z9hG4bK74bf9"
    assert invite.top_via.host == "client.atlanta.example.com"
    assert invite.headers.get("max-forwards") == "70"
    assert invite.headers.get_all("Allow") == ["INVITE", "ACK", "CANCEL", "BYE", "OPTIONS"]
    assert NameAddr.parse(invite.headers.get("Contact") or "").uri.params == {"transport": "udp"}


def test_a_canonically_written_message_serialises_back_byte_for_byte() -> None:
    assert request(INVITE).to_bytes() == INVITE
    assert parse_message(RINGING).to_bytes() == RINGING


def test_response_status_line_and_headers_parse() -> None:
    ringing = parse_message(RINGING)
    assert isinstance(ringing, SipResponse)
    assert (ringing.status, ringing.reason) == (180, "Ringing")
    assert ringing.to_tag == "8321234356"
    assert ringing.top_via.received == "192.0.2.101"
    assert ringing.body == b""


def test_a_reason_phrase_keeps_its_spaces_and_may_be_empty() -> None:
    message = parse_message(RINGING.replace(b"180 Ringing", b"481 Call/Transaction Does Not Exist"))
    assert isinstance(message, SipResponse)
    assert message.reason == "Call/Transaction Does Not Exist"
    message = parse_message(RINGING.replace(b"180 Ringing", b"180"))
    assert isinstance(message, SipResponse)
    assert (message.status, message.reason) == (180, "")


def test_folded_header_lines_join_into_one_value() -> None:
    message = request(
        options("Subject: I know you're there,\r\n   pick up the phone\r\n\tand talk to me!\r\n")
    )
    assert message.headers.get("Subject") == "I know you're there, pick up the phone and talk to me!"


def test_compact_headers_read_as_their_long_names() -> None:
    data = (
        b"BYE sip:alice@client.atlanta.example.com SIP/2.0\r\n"
        b"v: SIP/2.0/TCP client.biloxi.example.com:5060;branch=z9hG4bKnashds7\r\n"
        b"f: Bob <sip:bob@biloxi.example.com>;tag=8321234356\r\n"
        b"t: Alice <sip:alice@atlanta.example.com>;tag=9fxced76sl\r\n"
        b"i: 3848276298220188511@atlanta.example.com\r\n"
        b"CSeq: 1 BYE\r\n"
        b"m: <sip:bob@client.biloxi.example.com>\r\n"
        b"k: timer, 100rel\r\n"
        b"x: 1800;refresher=uac\r\n"
        b"s: bye\r\n"
        b"c: text/plain\r\n"
        b"l: 2\r\n"
        b"\r\nhi"
    )
    bye = request(data)
    assert [name for name, _ in bye.headers] == [
        "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Supported", "Session-Expires", "Subject",
        "Content-Type", "Content-Length",
    ]  # fmt: skip
    assert bye.to_tag == "9fxced76sl"
    assert bye.headers.get_all("Supported") == ["timer", "100rel"]
    assert bye.body == b"hi"
    assert b"\r\nCall-ID: 3848276298220188511@atlanta.example.com\r\n" in bye.to_bytes()


def test_header_names_are_case_insensitive_and_written_canonically() -> None:
    headers = Headers(
        [("call-id", "x"), ("CSEQ", "1 INVITE"), ("www-authenticate", "Digest realm=a"), ("x-foo", "1")]
    )
    assert [name for name, _ in headers] == ["Call-ID", "CSeq", "WWW-Authenticate", "X-Foo"]
    assert headers.get("CALL-ID") == headers.get("i") == "x"
    assert "cseq" in headers and "Contact" not in headers and "bad name" not in headers


def test_multiple_via_values_in_one_header_and_across_headers_keep_their_order() -> None:
    data = options().replace(
        b"Via: SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bKhjhs8ass877\r\n",
        b"Via: SIP/2.0/UDP p3.example.com;branch=z9hG4bK3, SIP/2.0/TCP p2.example.com:5070;branch=z9hG4bK2"
        b"\r\n"
        b"v: SIP / 2.0 / UDP [2001:db8::9] : 5062 ;branch=z9hG4bK1 ;received=2001:db8::10\r\n",
    )
    message = request(data)
    assert [(v.transport, v.host, v.port, v.branch) for v in message.vias] == [
        ("UDP", "p3.example.com", None, "z9hG4bK3"),
        ("TCP", "p2.example.com", 5070, "z9hG4bK2"),
        ("UDP", "[2001:db8::9]", 5062, "z9hG4bK1"),
    ]
    assert message.top_via.branch == "z9hG4bK3"


def test_list_headers_split_outside_quotes_and_angle_brackets_but_auth_headers_do_not() -> None:
    headers = Headers()
    headers.add("Contact", '"Doe, John" <sip:jd@h;x=a,b>;q=0.5, <sip:other@h> , sip:third@h')
    headers.add("Route", "<sip:p1@h;lr>,<sip:p2@h;lr>")
    headers.add("Authorization", 'Digest username="a", realm="b,c", nonce="n"')
    assert headers.get_all("Contact") == [
        '"Doe, John" <sip:jd@h;x=a,b>;q=0.5',
        "<sip:other@h>",
        "sip:third@h",
    ]
    assert headers.get_all("route") == ["<sip:p1@h;lr>", "<sip:p2@h;lr>"]
    assert headers.get_all("Authorization") == ['Digest username="a", realm="b,c", nonce="n"']


def test_headers_set_replaces_all_values_in_place_and_remove_and_copy_are_independent() -> None:
    headers = Headers([("Via", "a"), ("To", "t"), ("Via", "b")])
    copy = headers.copy()
    headers.set("v", "c")
    assert list(headers) == [("Via", "c"), ("To", "t")]
    headers.remove("TO")
    assert list(headers) == [("Via", "c")]
    assert list(copy) == [("Via", "a"), ("To", "t"), ("Via", "b")]
    assert headers.get("Missing") is None and headers.get_all("Missing") == []


def test_header_values_with_line_breaks_are_refused_so_nothing_can_be_injected() -> None:
    with pytest.raises(SipError):
        Headers().add("Subject", "hi\r\nVia: SIP/2.0/UDP evil")
    with pytest.raises(SipError):
        Headers().add("Bad Name", "x")


def test_a_datagram_body_past_content_length_is_dropped() -> None:
    assert request(options("Content-Length: 3\r\n", b"abcdef")).body == b"abc"


def test_a_datagram_without_content_length_takes_the_rest_as_its_body() -> None:
    assert request(options("", b"rest of it")).body == b"rest of it"


def test_empty_lines_before_the_start_line_and_bare_lf_line_ends_are_tolerated() -> None:
    message = request(b"\r\n\r\n" + options().replace(b"\r\n", b"\n"))
    assert message.method == "OPTIONS" and message.cseq == (63104, "OPTIONS")


def test_to_bytes_sets_content_length_from_the_body() -> None:
    message = request(options("Content-Length: 0\r\n"))
    message.body = b"hello"
    data = message.to_bytes()
    assert data.count(b"Content-Length") == 1 and b"Content-Length: 5\r\n\r\nhello" in data
    assert SipResponse(200, "OK").to_bytes() == b"SIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n"


def test_utf8_in_headers_is_accepted() -> None:
    message = request(options().replace(b"From: Alice", 'From: "Zoë Ångström"'.encode()))
    assert message.from_addr.display_name == "Zoë Ångström"


BAD_MESSAGES = {
    "empty": b"",
    "only blank lines": b"\r\n\r\n\r\n",
    "binary garbage": bytes(range(256)) * 4,
    "no blank line after the headers": options()[:-2],
    "missing CSeq": options().replace(b"CSeq: 63104 OPTIONS\r\n", b""),
    "missing Via": options().replace(
        b"Via: SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bKhjhs8ass877\r\n", b""
    ),
    "missing Call-ID": options().replace(b"Call-ID: a84b4c76e66710\r\n", b""),
    "CSeq method mismatch": options().replace(b"63104 OPTIONS", b"63104 INVITE"),
    "CSeq not a number": options().replace(b"63104 OPTIONS", b"x OPTIONS"),
    "CSeq too big": options().replace(b"63104 OPTIONS", b"99999999999 OPTIONS"),
    "non-numeric Content-Length": options("Content-Length: ten\r\n", b"0123456789"),
    "unicode digit Content-Length": options("Content-Length: ²\r\n", b"01"),
    "conflicting Content-Length": options("Content-Length: 1\r\nl: 2\r\n", b"01"),
    "body shorter than Content-Length": options("Content-Length: 20\r\n", b"short"),
    "header without colon": options("This line has no colon\r\n"),
    "header name with space": options("Bad Name: x\r\n"),
    "continuation before any header": b"OPTIONS sip:a@b SIP/2.0\r\n folded\r\n\r\n",
    "oversized": options("X-Padding: " + "a" * 70000 + "\r\n"),
    "too many headers": options("".join(f"X-H{i}: {i}\r\n" for i in range(101))),
    "bad UTF-8": options().replace(b"Alice", b"Al\xffice"),
    "NUL in a header": options("Subject: a\x00b\r\n"),
    "bare CR in a header": options("Subject: a\rb\r\n"),
    "unknown version": options().replace(b"SIP/2.0\r\n", b"SIP/3.0\r\n", 1),
    "request line with extra words": options().replace(b"OPTIONS sip:carol", b"OPTIONS  sip:carol"),
    "request-URI without scheme": options().replace(b"sip:carol@chicago.example.com SIP", b"carol SIP"),
    "status out of range": RINGING.replace(b"180 Ringing", b"700 Odd"),
    "status not three digits": RINGING.replace(b"180 Ringing", b"18 Ringing"),
    "malformed Via": options().replace(b"SIP/2.0/UDP pc33", b"SIP/2.0/UDP"),
    "Via with a bad port": options().replace(
        b"pc33.atlanta.example.com;", b"pc33.atlanta.example.com:99999;"
    ),
    "malformed From": options().replace(
        b"<sip:alice@atlanta.example.com>", b"<sip:alice@atlanta.example.com"
    ),
    "From with an unclosed quote": options().replace(b"From: Alice", b'From: "Alice'),
    "bad Max-Forwards": options().replace(b"Max-Forwards: 70", b"Max-Forwards: many"),
    "response missing To": RINGING.replace(b"To: Bob <sip:bob@biloxi.example.com>;tag=8321234356\r\n", b""),
}


@pytest.mark.parametrize("data", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_malformed_messages_raise_sip_error(data: bytes) -> None:
    with pytest.raises(SipError) as caught:
        parse_message(data)
    assert "\r" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_header_is_named_and_the_request_is_kept_to_answer_it() -> None:
    with pytest.raises(SipError, match="missing CSeq header") as caught:
        parse_message(BAD_MESSAGES["missing CSeq"])
    assert caught.value.status == 400
    assert caught.value.request is not None and caught.value.request.method == "OPTIONS"
    response = make_response(caught.value.request, 400, str(caught.value))
    assert response.reason == "missing CSeq header" and "CSeq" not in response.headers


@pytest.mark.parametrize(
    "case",
    [
        "body shorter than Content-Length",
        "non-numeric Content-Length",
        "header without colon",
        "CSeq method mismatch",
    ],
)
def test_a_request_with_a_usable_via_is_kept_in_the_error_to_answer_400(case: str) -> None:
    with pytest.raises(SipError) as caught:
        parse_message(BAD_MESSAGES[case])
    assert caught.value.status == 400
    assert caught.value.request is not None and caught.value.request.branch == "z9hG4bKhjhs8ass877"


@pytest.mark.parametrize(
    ("start", "status", "reason"),
    [
        (b"OPTIONS sip:carol@chicago.example.com SIP/3.0", 505, "SIP version 'SIP/3.0' is not supported"),
        (b"OPTIONS <> SIP/2.0", 400, "bad Request-URI '<>'"),
    ],
)
def test_a_bad_request_line_with_readable_headers_is_answered(start: bytes, status: int, reason: str) -> None:
    """Found by the fuzzer, where such requests were dropped without an answer."""
    data = options().replace(b"OPTIONS sip:carol@chicago.example.com SIP/2.0", start)
    assert data.startswith(start)
    with pytest.raises(SipError) as caught:
        parse_message(data)
    assert caught.value.status == status and str(caught.value) == reason
    assert caught.value.request is not None and caught.value.request.branch == "z9hG4bKhjhs8ass877"


def test_a_request_without_a_usable_via_or_a_response_cannot_be_answered() -> None:
    with pytest.raises(SipError) as caught:
        parse_message(BAD_MESSAGES["missing Via"])
    assert caught.value.request is None
    with pytest.raises(SipError) as caught:
        parse_message(BAD_MESSAGES["response missing To"])
    assert caught.value.request is None


def test_oversized_messages_ask_for_513() -> None:
    with pytest.raises(SipError) as caught:
        parse_message(BAD_MESSAGES["oversized"])
    assert caught.value.status == 513


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_raise_nothing_but_sip_error(data: bytes) -> None:
    with contextlib.suppress(SipError):
        parse_message(data)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from([INVITE, RINGING, options("Subject: x\r\n folded\r\n")]), st.data())
def test_mutated_messages_raise_nothing_but_sip_error_and_what_parses_round_trips(
    original: bytes, data: st.DataObject
) -> None:
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(mutated)))
        action = data.draw(st.sampled_from(["replace", "insert", "delete", "truncate"]))
        byte = data.draw(st.sampled_from(b'\x00\r\n \t:;,<>"=@[]/\\\xff0aZ'))
        if action == "replace" and at < len(mutated):
            mutated[at] = byte
        elif action == "insert":
            mutated.insert(at, byte)
        elif action == "delete" and at < len(mutated):
            del mutated[at]
        elif action == "truncate":
            del mutated[at:]
    try:
        message = parse_message(bytes(mutated))
    except SipError as e:
        assert "\n" not in str(e) and "\r" not in str(e)
        return
    _ = (message.call_id, message.cseq, message.branch, message.from_tag, message.to_tag)  # none may raise
    assert parse_message(message.to_bytes()) == message


# --- value types ---------------------------------------------------------------------------------------


def test_sip_uri_parts() -> None:
    uri = SipUri.parse(
        "sips:alice:secret@atlanta.example.com:5061;transport=TCP;LR;maddr=239.255.255.1?subject=hi&x=1"
    )
    assert (uri.scheme, uri.user, uri.password, uri.host, uri.port) == (
        "sips", "alice", "secret", "atlanta.example.com", 5061
    )  # fmt: skip
    assert uri.params == {"transport": "TCP", "lr": "", "maddr": "239.255.255.1"}
    assert uri.headers == {"subject": "hi", "x": "1"}


def test_ipv6_and_telephone_uris() -> None:
    v6 = SipUri.parse("sip:[2001:db8::1]:5070;transport=udp")
    assert (v6.host, v6.port, v6.user) == ("[2001:db8::1]", 5070, None)
    phone = SipUri.parse("sip:+1-212-555-1212;phone-context=example.com@gateway.example.com;user=phone")
    assert (phone.user, phone.params) == ("+1-212-555-1212;phone-context=example.com", {"user": "phone"})
    tel = SipUri.parse("tel:+1-201-555-0123;ext=44")
    assert (tel.scheme, tel.user, tel.host, tel.params) == ("tel", "+1-201-555-0123", "", {"ext": "44"})


URIS = [
    "sip:alice@atlanta.example.com",
    "sip:atlanta.example.com",
    "sips:alice:@a.example.com:5061;transport=tcp;lr",
    "sip:[::1]",
    "sip:[2001:db8::1]:5060;maddr=[2001:db8::2]",
    "sip:bob@192.0.2.4?subject=project%20x&priority=urgent",
    "sip:%61lice@atlanta.example.com;ob",
    "tel:+358-555-1234567;postd=pp22",
]


@pytest.mark.parametrize("text", URIS)
def test_uris_round_trip(text: str) -> None:
    uri = SipUri.parse(text)
    assert SipUri.parse(str(uri)) == uri


@pytest.mark.parametrize(
    "text",
    ["http://example.com", "sip:", "sip:@h", "sip:h:99999", "sip:h:", "sip:[::1", "sip:[nothex]", "sip:h;;x",
     "sip:a b@h", "sip:a@h>", "tel:", "tel:+1?x=y", "sip:a@h?=v", "sip:h:5060x"],
)  # fmt: skip
def test_malformed_uris_raise_sip_error(text: str) -> None:
    with pytest.raises(SipError):
        SipUri.parse(text)


def test_name_addr_forms() -> None:
    quoted = NameAddr.parse('"Bob \\"the\\" Builder" <sip:bob@biloxi.example.com;transport=tcp>;tag=a48s')
    assert (quoted.display_name, quoted.tag, quoted.uri.params) == (
        'Bob "the" Builder',
        "a48s",
        {"transport": "tcp"},
    )
    token = NameAddr.parse("Bob  Smith<sip:bob@h>")
    assert (token.display_name, token.uri.user, token.params) == ("Bob Smith", "bob", {})
    bracketed = NameAddr.parse("<sip:bob@h;tag=inside>")
    assert (bracketed.display_name, bracketed.tag, bracketed.uri.params) == (None, None, {"tag": "inside"})


def test_params_after_an_unbracketed_uri_belong_to_the_header() -> None:
    # RFC 3261 20.10
    addr = NameAddr.parse('sip:bob@h;tag=8321234356;+sip.instance="<urn:uuid:00000000-0000-1000-8000-0000>"')
    assert addr.uri == SipUri("h", "bob")
    assert addr.params == {"tag": "8321234356", "+sip.instance": "<urn:uuid:00000000-0000-1000-8000-0000>"}


NAME_ADDRS = [
    '"Bob" <sip:b@h>;tag=1',
    "<sip:b@h>",
    "sip:b@h;tag=1;expires=60",
    '"A \\\\ B, C" <sips:a@[::1]:5061;lr>;q=0.7;+sip.instance="<urn:x>"',
    "Anonymous <sip:anonymous@anonymous.invalid>;tag=x;received=2001:db8::1",
    "<tel:+15551234>",
]


@pytest.mark.parametrize("text", NAME_ADDRS)
def test_name_addrs_round_trip(text: str) -> None:
    addr = NameAddr.parse(text)
    assert NameAddr.parse(str(addr)) == addr


@pytest.mark.parametrize(
    "text", ["", "*", '"Bob <sip:b@h>', '"Bob" sip:b@h', "<sip:b@h", "<sip:b@h>x", "<sip:b@h>;=1"]
)
def test_malformed_name_addrs_raise_sip_error(text: str) -> None:
    with pytest.raises(SipError):
        NameAddr.parse(text)


def test_via_parts() -> None:
    via = Via.parse(
        "SIP/2.0/tcp [2001:db8::1]:5062;branch=z9hG4bK776;received=2001:db8::2;rport;maddr=x.example;ttl=16"
    )
    assert (via.protocol, via.transport, via.host, via.port) == ("SIP/2.0/TCP", "TCP", "[2001:db8::1]", 5062)
    assert (via.branch, via.received, via.rport, via.maddr, via.ttl) == (
        "z9hG4bK776", "2001:db8::2", None, "x.example", 16
    )  # fmt: skip
    assert "rport" in via.params
    assert Via.parse("SIP/2.0/UDP h;rport=5070").rport == 5070


VIAS = [
    "SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bK776asdhds",
    "SIP/2.0/TLS 192.0.2.1:5061;branch=z9hG4bK1;received=192.0.2.9;rport=6000",
    'SIP/2.0/UDP [::1];rport;x-ext="a b"',
    "SIP / 2.0 / WSS df7jal23ls0d.invalid ; branch = z9hG4bKx",
]


@pytest.mark.parametrize("text", VIAS)
def test_vias_round_trip(text: str) -> None:
    via = Via.parse(text)
    assert Via.parse(str(via)) == via


@pytest.mark.parametrize(
    "text",
    ["", "SIP/2.0/UDP", "HTTP/1.1/TCP h", "SIP/2.0/UDP h:0x50", "SIP/2.0/UDP h;rport=x",
     "SIP/2.0/UDP h;ttl=300", "SIP/2.0/UDP h;branch=\"a b\"", "SIP/2.0/UDP ::1", "SIP/2.0/UDP h;;x"],
)  # fmt: skip
def test_malformed_vias_raise_sip_error(text: str) -> None:
    with pytest.raises(SipError):
        Via.parse(text)


# --- responses ---------------------------------------------------------------------------------------------


def test_make_response_copies_vias_from_to_call_id_and_cseq_and_adds_the_to_tag() -> None:
    data = INVITE.replace(
        b"Max-Forwards: 70\r\n",
        b"Via: SIP/2.0/UDP p2.example.com;branch=z9hG4bKp2, SIP/2.0/TCP p1;branch=z9hG4bKp1\r\n",
    )
    invite = request(data)
    ok = make_response(invite, 200, to_tag="314159", body=SDP, content_type="application/sdp")
    assert (ok.status, ok.reason) == (200, "OK")
    assert ok.headers.get_all("Via") == invite.headers.get_all("Via")
    assert [v for n, v in ok.headers if n == "Via"] == [v for n, v in invite.headers if n == "Via"]
    assert ok.headers.get("From") == invite.headers.get("From")
    assert ok.headers.get("To") == "Bob <sip:bob@biloxi.example.com>;tag=314159"
    assert (ok.call_id, ok.cseq, ok.to_tag) == (invite.call_id, (1, "INVITE"), "314159")
    assert ok.headers.get("Content-Type") == "application/sdp"
    assert parse_message(ok.to_bytes()) == ok


def test_make_response_keeps_an_existing_to_tag() -> None:
    bye = request(
        options().replace(
            b"To: <sip:carol@chicago.example.com>", b"To: <sip:carol@chicago.example.com>;tag=x"
        )
    )
    assert make_response(bye, 200, to_tag="y").to_tag == "x"


@pytest.mark.parametrize(
    ("status", "reason"),
    [(100, "Trying"), (180, "Ringing"), (183, "Session Progress"), (200, "OK"), (400, "Bad Request"),
     (401, "Unauthorized"), (403, "Forbidden"), (404, "Not Found"), (405, "Method Not Allowed"),
     (407, "Proxy Authentication Required"), (408, "Request Timeout"), (415, "Unsupported Media Type"),
     (481, "Call/Transaction Does Not Exist"), (486, "Busy Here"), (487, "Request Terminated"),
     (488, "Not Acceptable Here"), (491, "Request Pending"), (500, "Server Internal Error"),
     (501, "Not Implemented"), (503, "Service Unavailable"), (603, "Decline"), (499, "Bad Request"),
     (299, "OK")],
)  # fmt: skip
def test_make_response_has_a_default_reason_per_status(status: int, reason: str) -> None:
    assert make_response(request(options()), status).reason == reason


def test_make_response_takes_a_reason_and_extra_headers_and_echoes_timestamp_in_100() -> None:
    message = request(options("Timestamp: 54\r\n"))
    busy = make_response(message, 486, "Gone fishing", headers=[("Retry-After", "60")])
    assert (busy.reason, busy.headers.get("Retry-After"), busy.headers.get("Timestamp")) == (
        "Gone fishing",
        "60",
        None,
    )
    assert make_response(message, 100).headers.get("Timestamp") == "54"  # RFC 3261 8.2.6.1


def test_new_identifiers_are_unique_tokens() -> None:
    branches = {new_branch() for _ in range(100)}
    assert len(branches) == 100 and all(b.startswith("z9hG4bK") for b in branches)
    assert new_tag() != new_tag() and new_tag().isalnum()
    assert new_call_id("192.0.2.1").endswith("@192.0.2.1") and "@" not in new_call_id("")


# --- received / rport -------------------------------------------------------------------------------------


def invite_via(via: str) -> SipRequest:
    return request(
        INVITE.replace(b"SIP/2.0/UDP client.atlanta.example.com:5060;branch=z9hG4bK74bf9;rport", via.encode())
    )


def test_received_is_added_when_sent_by_is_a_name_or_another_address() -> None:
    named = invite_via("SIP/2.0/UDP client.atlanta.example.com:5060;branch=z9hG4bK1")
    assert fix_via_received(named, "192.0.2.101", 5060).received == "192.0.2.101"
    assert named.top_via.received == "192.0.2.101"
    other = invite_via("SIP/2.0/UDP 10.0.0.5:5060;branch=z9hG4bK1")
    assert fix_via_received(other, "192.0.2.101", 5060).received == "192.0.2.101"


def test_received_is_not_added_when_sent_by_is_the_source_address() -> None:
    same = invite_via("SIP/2.0/UDP 192.0.2.101:5060;branch=z9hG4bK1")
    assert fix_via_received(same, "192.0.2.101", 5060).received is None
    v6 = invite_via("SIP/2.0/UDP [2001:db8:0::1];branch=z9hG4bK1")
    assert fix_via_received(v6, "2001:db8::1", 5060).received is None
    mapped = invite_via("SIP/2.0/UDP 192.0.2.101;branch=z9hG4bK1")
    assert fix_via_received(mapped, "::ffff:192.0.2.101", 5060).received is None


def test_a_bare_rport_is_filled_with_the_source_port_and_received_is_added_even_if_the_same() -> None:
    # RFC 3581 4
    invite = invite_via("SIP/2.0/UDP 192.0.2.101:5060;rport;branch=z9hG4bK1")
    via = fix_via_received(invite, "192.0.2.101", 41234)
    assert (via.rport, via.received) == (41234, "192.0.2.101")
    assert (
        invite.headers.get("Via")
        == "SIP/2.0/UDP 192.0.2.101:5060;rport=41234;branch=z9hG4bK1;received=192.0.2.101"
    )


def test_fixing_the_top_via_keeps_the_other_values_of_its_header() -> None:
    invite = invite_via("SIP/2.0/UDP a.example;branch=z9hG4bK1, SIP/2.0/UDP b.example;branch=z9hG4bK2")
    fix_via_received(invite, "192.0.2.7", 5060)
    assert invite.headers.get_all("Via") == [
        "SIP/2.0/UDP a.example;branch=z9hG4bK1;received=192.0.2.7",
        "SIP/2.0/UDP b.example;branch=z9hG4bK2",
    ]


@pytest.mark.parametrize(
    ("via", "transport", "destination"),
    [
        ("SIP/2.0/UDP a.example;branch=z9hG4bK1;received=192.0.2.7;rport=4000", "UDP", ("192.0.2.7", 4000)),
        ("SIP/2.0/UDP a.example:5070;branch=z9hG4bK1;received=192.0.2.7", "UDP", ("192.0.2.7", 5070)),
        ("SIP/2.0/UDP 192.0.2.8;branch=z9hG4bK1", "UDP", ("192.0.2.8", 5060)),
        # maddr is never followed: it would let a request aim our responses at anyone.
        ("SIP/2.0/UDP a.example:5080;branch=z9hG4bK1;maddr=239.255.255.1;received=192.0.2.7", "UDP",
         ("192.0.2.7", 5080)),
        ("SIP/2.0/TCP a.example:5080;branch=z9hG4bK1;received=192.0.2.7;rport=4000", "TCP",
         ("192.0.2.7", 5080)),
        ("SIP/2.0/TLS 192.0.2.9;branch=z9hG4bK1", "TLS", ("192.0.2.9", 5061)),
        ("SIP/2.0/UDP [2001:db8::1];branch=z9hG4bK1;rport=4000", "UDP", ("2001:db8::1", 4000)),
        ("SIP/2.0/UDP [2001:db8::1];branch=z9hG4bK1;received=2001:db8::2;rport=4000", "UDP",
         ("2001:db8::2", 4000)),
    ],
)  # fmt: skip
def test_response_destination_is_the_received_address_then_sent_by(
    via: str, transport: str, destination: tuple[str, int]
) -> None:
    assert response_destination(Via.parse(via), transport) == destination


@pytest.mark.parametrize(
    "via",
    [
        "SIP/2.0/UDP a.example;branch=z9hG4bK1",
        "SIP/2.0/TLS a.example;branch=z9hG4bK1;maddr=192.0.2.7",
        "SIP/2.0/UDP a.example;branch=z9hG4bK1;received=b.example",
    ],
)
def test_response_destination_is_never_a_name(via: str) -> None:
    assert response_destination(Via.parse(via), "UDP") is None


# --- stream framing ---------------------------------------------------------------------------------------


STREAM = b"\r\n\r\n" + INVITE + b"\r\n\r\n" + RINGING + b"\r\n" + options("Content-Length: 2\r\n", b"ok")


def test_stream_framer_finds_messages_split_at_every_byte_boundary_and_skips_keep_alives() -> None:
    expected = [INVITE, RINGING, options("Content-Length: 2\r\n", b"ok")]
    for cut in range(len(STREAM) + 1):
        framer = StreamFramer()
        assert framer.feed(STREAM[:cut]) + framer.feed(STREAM[cut:]) == expected, cut


def test_stream_framer_fed_one_byte_at_a_time() -> None:
    framer = StreamFramer()
    messages = [m for i in range(len(STREAM)) for m in framer.feed(STREAM[i : i + 1])]
    assert [parse_message(m).cseq for m in messages] == [(1, "INVITE"), (1, "INVITE"), (63104, "OPTIONS")]
    assert framer.feed(b"\r\n\r\n") == []


def test_stream_framer_cuts_out_a_malformed_message_whole_so_the_connection_survives_it() -> None:
    bad = options("Content-Length: 0\r\nThis line has no colon\r\n")
    framed = StreamFramer().feed(bad + RINGING)
    assert framed == [bad, RINGING]
    with pytest.raises(SipError) as caught:
        parse_message(framed[0])
    assert caught.value.request is not None


def test_stream_framer_requires_content_length() -> None:
    with pytest.raises(SipError, match="Content-Length"):
        StreamFramer().feed(options())


def test_stream_framer_is_bounded() -> None:
    framer = StreamFramer()
    framer.feed(b"OPTIONS sip:a@b SIP/2.0\r\n")
    with pytest.raises(SipError):
        for _ in range(100):
            framer.feed(b"X-Padding: " + b"a" * 1000 + b"\r\n")
    with pytest.raises(SipError):
        StreamFramer().feed(options("Content-Length: 99999\r\n"))
