"""SDP offer/answer (RFC 4566, RFC 3264) with the offers real phones and test tools send."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.transports.sip.sdes import Crypto, CryptoError, SrtpKeys
from parley.transports.sip.sdp import (
    MAX_SDP_BYTES,
    Negotiated,
    SdpError,
    answer,
    negotiated_from_answer,
    offer,
    parse_sdp,
)

# baresip 1.0 on Debian, captured from its INVITE (many codecs; telephone-event on 105).
BARESIP_OFFER = """v=0
o=- 3111059848 168135786 IN IP4 127.0.0.1
s=-
c=IN IP4 127.0.0.1
t=0 0
a=tool:baresip 1.0.0
m=audio 9012 RTP/AVP 0 8 96 9 97 10 98 99 100 101 11 102 103 104 105
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:96 opus/48000/2
a=fmtp:96 stereo=1;sprop-stereo=1
a=rtpmap:9 G722/8000
a=rtpmap:97 L16/48000/2
a=rtpmap:10 L16/44100/2
a=rtpmap:98 L16/32000/2
a=rtpmap:99 L16/16000/2
a=rtpmap:100 L16/8000/2
a=rtpmap:101 L16/48000
a=rtpmap:11 L16/44100
a=rtpmap:102 L16/32000
a=rtpmap:103 L16/16000
a=rtpmap:104 L16/8000
a=rtpmap:105 telephone-event/8000
a=fmtp:105 0-15
a=sendrecv
a=label:1
a=rtcp-rsize
a=ssrc:2125219310 cname:sip:bob@127.0.0.1
a=minptime:4
a=ptime:20
""".replace("\n", "\r\n")

# SIPp 3.6's uac_pcap scenario: PCMA only, RFC 2833 digits on 101.
SIPP_PCAP_OFFER = """v=0
o=user1 53655765 2353687637 IN IP4 10.0.0.5
s=-
c=IN IP4 10.0.0.5
t=0 0
m=audio 6000 RTP/AVP 8 101
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-11,16
"""


def answer_to(text: str) -> tuple[str, Negotiated]:
    return answer(parse_sdp(text), address="192.0.2.10", port=40000, session_id=7, session_version=1)


def media_lines(sdp: str) -> list[str]:
    return [line for line in sdp.split("\r\n") if line.startswith("m=")]


def test_a_baresip_offer_is_answered_with_its_first_codec_and_its_digit_type() -> None:
    text, negotiated = answer_to(BARESIP_OFFER)
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    assert text.split("\r\n")[:5] == [
        "v=0",
        "o=parley 7 1 IN IP4 192.0.2.10",
        "s=parley",
        "c=IN IP4 192.0.2.10",
        "t=0 0",
    ]
    assert media_lines(text) == ["m=audio 40000 RTP/AVP 0 105"]
    for line in ("a=rtpmap:0 PCMU/8000", "a=rtpmap:105 telephone-event/8000", "a=fmtp:105 0-16"):
        assert line in text
    assert "a=ptime:20" in text and "a=sendrecv" in text
    assert negotiated == Negotiated(
        remote_address="127.0.0.1",
        remote_port=9012,
        codec="PCMU",
        payload_type=0,
        telephone_event_pt=105,
        direction="sendrecv",
        ptime=20,
    )
    assert negotiated.sends and negotiated.receives


def test_the_offerers_first_supported_codec_wins_even_behind_others() -> None:
    offer_text = BARESIP_OFFER.replace("RTP/AVP 0 8 96", "RTP/AVP 96 8 0")
    text, negotiated = answer_to(offer_text)
    assert (negotiated.codec, negotiated.payload_type) == ("PCMA", 8)
    assert media_lines(text) == ["m=audio 40000 RTP/AVP 8 105"]


def test_a_sipp_pcap_offer_gets_pcma_and_digits_on_101() -> None:
    text, negotiated = answer_to(SIPP_PCAP_OFFER)
    assert media_lines(text) == ["m=audio 40000 RTP/AVP 8 101"]
    assert (negotiated.codec, negotiated.telephone_event_pt) == ("PCMA", 101)
    assert (negotiated.remote_address, negotiated.remote_port) == ("10.0.0.5", 6000)


def test_pcmu_on_a_dynamic_payload_type_is_recognised_by_its_rtpmap() -> None:
    offer_text = SIPP_PCAP_OFFER.replace("RTP/AVP 8 101", "RTP/AVP 96").replace(
        "a=rtpmap:8 PCMA/8000", "a=rtpmap:96 pcmu/8000"
    )
    text, negotiated = answer_to(offer_text)
    assert (negotiated.codec, negotiated.payload_type, negotiated.telephone_event_pt) == ("PCMU", 96, None)
    assert media_lines(text) == ["m=audio 40000 RTP/AVP 96"]
    assert "telephone-event" not in text


def test_an_offer_that_sends_only_puts_us_on_hold_and_we_receive_only() -> None:
    text, negotiated = answer_to(SIPP_PCAP_OFFER + "a=sendonly\n")
    assert "a=recvonly" in text
    assert negotiated.direction == "recvonly"
    assert not negotiated.sends and negotiated.receives


def test_the_old_hold_with_a_zero_address_stops_our_sending() -> None:
    text, negotiated = answer_to(SIPP_PCAP_OFFER.replace("c=IN IP4 10.0.0.5", "c=IN IP4 0.0.0.0"))
    assert "a=sendrecv" in text
    assert negotiated.remote_address == "0.0.0.0" and not negotiated.sends


@pytest.mark.parametrize(
    ("offered", "answered"),
    [("sendrecv", "sendrecv"), ("recvonly", "sendonly"), ("sendonly", "recvonly"), ("inactive", "inactive")],
)
def test_the_answer_mirrors_the_offered_direction(offered: str, answered: str) -> None:
    text, negotiated = answer_to(SIPP_PCAP_OFFER + f"a={offered}\n")
    assert f"a={answered}" in text and negotiated.direction == answered


def test_a_session_level_direction_applies_to_a_media_line_without_one() -> None:
    offer_text = SIPP_PCAP_OFFER.replace("t=0 0\n", "t=0 0\na=inactive\n")
    assert answer_to(offer_text)[1].direction == "inactive"


def test_an_offer_without_a_common_codec_is_refused() -> None:
    offer_text = "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
    offer_text += "m=audio 5004 RTP/AVP 18 9\r\na=rtpmap:18 G729/8000\r\na=rtpmap:9 G722/8000\r\n"
    with pytest.raises(SdpError, match="no RTP/AVP audio stream"):
        answer_to(offer_text)


def test_srtp_audio_is_declined_like_any_unsupported_stream() -> None:
    with pytest.raises(SdpError):
        answer_to(SIPP_PCAP_OFFER.replace("RTP/AVP", "RTP/SAVP"))


def test_a_video_line_keeps_its_place_with_port_zero() -> None:
    offer_text = (
        SIPP_PCAP_OFFER.replace("m=audio", "m=video 6002 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\nm=audio")
        + "m=audio 6004 RTP/AVP 0\r\n"
    )
    text, negotiated = answer_to(offer_text)
    assert media_lines(text) == [
        "m=video 0 RTP/AVP 96",
        "m=audio 40000 RTP/AVP 8 101",
        "m=audio 0 RTP/AVP 0",  # one audio stream per call; a second one is declined
    ]
    assert negotiated.remote_port == 6000


def test_a_media_level_address_overrides_the_session_one_and_rtcp_port_is_read() -> None:
    offer_text = SIPP_PCAP_OFFER + "c=IN IP4 10.9.9.9\r\na=rtcp:6101\r\na=ptime:30\r\n"
    negotiated = answer_to(offer_text)[1]
    assert (negotiated.remote_address, negotiated.remote_rtcp_port, negotiated.ptime) == (
        "10.9.9.9",
        6101,
        30,
    )


def test_ipv6_is_offered_and_answered_as_ip6() -> None:
    offer_text = SIPP_PCAP_OFFER.replace("IN IP4 10.0.0.5", "IN IP6 2001:db8::5")
    text, negotiated = answer(
        parse_sdp(offer_text), address="2001:db8::10", port=40000, session_id=1, session_version=1
    )
    assert "c=IN IP6 2001:db8::10" in text and "o=parley 1 1 IN IP6 2001:db8::10" in text
    assert negotiated.remote_address == "2001:db8::5"


def test_our_offer_and_a_peers_answer_agree_on_the_stream() -> None:
    ours = offer(address="192.0.2.10", port=40000, session_id=3, session_version=1)
    assert media_lines(ours) == ["m=audio 40000 RTP/AVP 0 8 101"]
    peer_answer, _ = answer(
        parse_sdp(ours), address="198.51.100.7", port=7078, session_id=9, session_version=1
    )
    negotiated = negotiated_from_answer(ours, parse_sdp(peer_answer))
    assert (negotiated.remote_address, negotiated.remote_port) == ("198.51.100.7", 7078)
    assert (negotiated.codec, negotiated.payload_type, negotiated.telephone_event_pt) == ("PCMU", 0, 101)
    assert negotiated.direction == "sendrecv"


def test_a_peer_that_answers_pcma_only_and_recvonly_gets_pcma_and_we_send_only() -> None:
    ours = offer(address="192.0.2.10", port=40000, session_id=3, session_version=1)
    peer = "v=0\r\no=- 1 1 IN IP4 10.0.0.8\r\ns=-\r\nc=IN IP4 10.0.0.8\r\nt=0 0\r\n"
    peer += "m=audio 7000 RTP/AVP 8\r\na=recvonly\r\n"
    negotiated = negotiated_from_answer(ours, parse_sdp(peer))
    assert (negotiated.codec, negotiated.telephone_event_pt, negotiated.direction) == (
        "PCMA",
        None,
        "sendonly",
    )


def test_an_answer_that_declines_our_audio_is_an_error() -> None:
    ours = offer(address="192.0.2.10", port=40000, session_id=3, session_version=1, telephone_event_pt=None)
    peer = "v=0\r\no=- 1 1 IN IP4 10.0.0.8\r\ns=-\r\nc=IN IP4 10.0.0.8\r\nt=0 0\r\nm=audio 0 RTP/AVP 0\r\n"
    with pytest.raises(SdpError, match="declined"):
        negotiated_from_answer(ours, parse_sdp(peer))


def test_we_cannot_offer_a_codec_we_do_not_speak() -> None:
    with pytest.raises(ValueError, match="opus"):
        offer(address="192.0.2.10", port=40000, session_id=3, session_version=1, codecs=("opus",))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "start with v=0"),
        ("v=1\r\n", "start with v=0"),
        ("v=0\r\ns=-\r\n", "no o= line"),
        ("v=0\r\no=- 1 1 IN IP4\r\n", "line 2"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nc=IN IP4\r\n", "line 3"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio\r\n", "line 3"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 99999 RTP/AVP 0\r\n", "outside"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 5000 RTP/AVP x\r\n", "line 3"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 5000 RTP/AVP 200\r\n", "0..127"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 5000 RTP/AVP 0\r\na=rtpmap:0 PCMU\r\n", "line 4"),
        ("v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 5000 RTP/AVP 0\r\na=ptime:inf\r\n", "line 4"),
        ("v=0\r\nbogus\r\n", "not <type>=<value>"),
        ("v=0\r\n" + "a=x\r\n" * 600, "lines is over"),
        ("v=0\r\n" + "x" * MAX_SDP_BYTES, "characters is over"),
    ],
)
def test_malformed_sdp_is_refused_with_a_clear_reason(text: str, reason: str) -> None:
    with pytest.raises(SdpError, match=reason):
        parse_sdp(text)


SDP_VALUES = st.one_of(
    st.sampled_from(
        ["audio 5000 RTP/AVP 0 101", "IN IP4 10.0.0.1", "rtpmap:101 telephone-event/8000", "sendonly"]
    ),
    st.text(alphabet="0123456789 /:.-=INPAVRTmuadiocrtpxf", max_size=30),
)
SDP_LINES = st.lists(st.tuples(st.sampled_from(list("vocmats")), SDP_VALUES), max_size=12)


@given(SDP_LINES)
def test_garbled_lines_raise_only_sdp_error(lines: list[tuple[str, str]]) -> None:
    text = "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\n" + "".join(f"{kind}={value}\r\n" for kind, value in lines)
    try:
        session = parse_sdp(text)
    except SdpError:
        return
    with contextlib.suppress(SdpError):
        answer(session, address="192.0.2.10", port=40000, session_id=1, session_version=1)


# Issue 42 item 2: the RTP destination is an IP literal, never a name resolved on the event loop.


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("IN IP4 media.example.com", "not an IP address"),
        ("IN IP4 bücher.example", "not an IP address"),
        ("IN IP4 010.0.0.1", "not an IP address"),
        ("IN IP4 2001:db8::1", "not an IP4 address"),
        ("IN IP6 10.0.0.1", "not an IP6 address"),
        ("IN IP4 224.2.1.1/127", "multicast"),
        ("IN IP6 fe80::1%eth0", "interface"),
    ],
)
def test_a_connection_address_must_be_a_unicast_ip_literal(address: str, reason: str) -> None:
    with pytest.raises(SdpError, match=reason):
        parse_sdp(SIPP_PCAP_OFFER.replace("c=IN IP4 10.0.0.5", f"c={address}"))


def test_a_media_level_name_is_refused_as_well_as_a_session_level_one() -> None:
    with pytest.raises(SdpError, match="not an IP address"):
        parse_sdp(SIPP_PCAP_OFFER + "c=IN IP4 rtp.example.net\r\n")


def test_an_ipv6_address_is_kept_in_its_canonical_form() -> None:
    offer_text = SIPP_PCAP_OFFER.replace("IN IP4 10.0.0.5", "IN IP6 2001:DB8:0:0::5")
    assert answer_to(offer_text)[1].remote_address == "2001:db8::5"


# Item 7: SDES-SRTP (RFC 4568) in the offer and answer.

THEIR_KEY = bytes(range(30))
OUR_KEY = bytes(range(100, 130))
SAVP_OFFER = SIPP_PCAP_OFFER.replace("RTP/AVP", "RTP/SAVP") + (
    "a=crypto:1 AES_256_CM_HMAC_SHA1_80 inline:" + base64.b64encode(bytes(46)).decode() + "\r\n"
    "a=crypto:2 AES_CM_128_HMAC_SHA1_80 inline:" + base64.b64encode(THEIR_KEY).decode() + "|2^31|1:4\r\n"
    "a=crypto:3 AES_CM_128_HMAC_SHA1_80 inline:"
    + base64.b64encode(THEIR_KEY).decode()
    + " UNENCRYPTED_SRTP\r\n"
    "a=crypto:4 AES_CM_128_HMAC_SHA1_32 inline:" + base64.b64encode(THEIR_KEY).decode() + "|2^31\r\n"
)
AVP_AND_SAVP = SAVP_OFFER + "m=audio 6010 RTP/AVP 0\r\n"


def savp_answer(text: str, *, key: bytes | None = OUR_KEY, require: bool = False) -> tuple[str, Negotiated]:
    return answer(
        parse_sdp(text),
        address="192.0.2.10",
        port=40000,
        session_id=7,
        session_version=1,
        srtp_key=key,
        require_srtp=require,
    )


def test_an_savp_offer_is_answered_with_its_first_usable_crypto_line_and_our_own_key() -> None:
    text, negotiated = savp_answer(SAVP_OFFER)
    assert media_lines(text) == ["m=audio 40000 RTP/SAVP 8 101"]
    crypto = [line for line in text.split("\r\n") if line.startswith("a=crypto")]
    # 256-bit keys, an MKI and a session parameter are not ours: the fourth line is taken, its tag kept.
    assert crypto == ["a=crypto:4 AES_CM_128_HMAC_SHA1_32 inline:" + base64.b64encode(OUR_KEY).decode()]
    assert negotiated.srtp == SrtpKeys("AES_CM_128_HMAC_SHA1_32", local=OUR_KEY, remote=THEIR_KEY)


def test_secure_media_is_preferred_to_plain_and_plain_taken_without_secure_signalling() -> None:
    text, negotiated = savp_answer(AVP_AND_SAVP)
    assert media_lines(text) == ["m=audio 40000 RTP/SAVP 8 101", "m=audio 0 RTP/AVP 0"]
    assert negotiated.srtp is not None
    text, negotiated = savp_answer(AVP_AND_SAVP, key=None)  # the INVITE came over UDP or TCP
    assert media_lines(text) == ["m=audio 0 RTP/SAVP 8 101", "m=audio 40000 RTP/AVP 0"]
    assert negotiated.srtp is None and "crypto" not in text


def test_keys_offered_over_insecure_signalling_are_refused() -> None:
    with pytest.raises(SdpError, match="only over TLS"):
        savp_answer(SAVP_OFFER, key=None)


def test_required_encryption_refuses_a_plain_offer_and_keys_without_tls() -> None:
    with pytest.raises(SdpError, match="encrypted media is required"):
        savp_answer(SIPP_PCAP_OFFER, require=True)
    with pytest.raises(SdpError, match="only over TLS"):
        savp_answer(AVP_AND_SAVP, key=None, require=True)
    assert savp_answer(AVP_AND_SAVP, require=True)[1].srtp is not None


def test_our_savp_offer_and_a_peers_answer_agree_on_crossed_keys() -> None:
    ours = offer(address="192.0.2.10", port=40000, session_id=3, session_version=1, srtp_key=OUR_KEY)
    assert media_lines(ours) == ["m=audio 40000 RTP/SAVP 0 8 101"]
    assert (
        "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" in ours and "a=crypto:2 AES_CM_128_HMAC_SHA1_32" in ours
    )
    peer_answer, theirs = answer(
        parse_sdp(ours),
        address="198.51.100.7",
        port=7078,
        session_id=9,
        session_version=1,
        srtp_key=THEIR_KEY,
    )
    negotiated = negotiated_from_answer(ours, parse_sdp(peer_answer))
    assert negotiated.srtp == SrtpKeys("AES_CM_128_HMAC_SHA1_80", local=OUR_KEY, remote=THEIR_KEY)
    assert theirs.srtp == SrtpKeys("AES_CM_128_HMAC_SHA1_80", local=THEIR_KEY, remote=OUR_KEY)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda a: a.replace("RTP/SAVP", "RTP/AVP"), "does not match"),
        (lambda a: a.replace("a=crypto:1 ", "a=crypto:9 "), "not one we offered"),
        (
            lambda a: a.replace("a=crypto:1 AES_CM_128_HMAC_SHA1_80", "a=crypto:1 AES_CM_128_HMAC_SHA1_32"),
            "not one",
        ),
        (lambda a: "\r\n".join(line for line in a.split("\r\n") if "crypto" not in line), "exactly one"),
    ],
)
def test_an_answer_that_does_not_key_our_offer_is_an_error(change: Callable[[str], str], reason: str) -> None:
    ours = offer(address="192.0.2.10", port=40000, session_id=3, session_version=1, srtp_key=OUR_KEY)
    peer_answer, _ = answer(
        parse_sdp(ours),
        address="198.51.100.7",
        port=7078,
        session_id=9,
        session_version=1,
        srtp_key=THEIR_KEY,
    )
    with pytest.raises(SdpError, match=reason):
        negotiated_from_answer(ours, parse_sdp(change(peer_answer)))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1 AES_CM_128_HMAC_SHA1_80", "needs"),
        ("x AES_CM_128_HMAC_SHA1_80 inline:AAAA", "tag"),
        ("1 F8_128_HMAC_SHA1_80 inline:AAAA", "suite"),
        ("1 AES_CM_128_HMAC_SHA1_80 uri:https://example.com/key", "inline"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:%%%%", "base64"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:AAAA", "bytes"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + base64.b64encode(THEIR_KEY).decode() + "|2^20|1:4", "MKI"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + base64.b64encode(THEIR_KEY).decode() + ";inline:AAAA", "MKI"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + base64.b64encode(THEIR_KEY).decode() + " KDR=1", "session"),
    ],
)
def test_crypto_lines_we_cannot_use_are_refused_with_a_reason(value: str, reason: str) -> None:
    with pytest.raises(CryptoError, match=reason):
        Crypto.parse(value)


def test_a_crypto_line_round_trips() -> None:
    line = Crypto(5, "AES_CM_128_HMAC_SHA1_80", THEIR_KEY)
    assert Crypto.parse(str(line)) == line
    assert base64.b64encode(THEIR_KEY).decode() not in repr(line)
