"""G.711 companding: bit-exact with the ITU-T reference (the stdlib's audioop, on the Python we ship)."""

from __future__ import annotations

import timeit
import warnings
from collections.abc import Callable

import numpy as np
import pytest

from parley.audio import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # the reference only: removed in Python 3.13

EVERY_SAMPLE = np.arange(-32768, 32768, dtype=np.int16)
EVERY_CODE = bytes(range(256))


def test_ulaw_encodes_every_sample_as_the_reference_does() -> None:
    assert ulaw_encode(EVERY_SAMPLE) == audioop.lin2ulaw(EVERY_SAMPLE.tobytes(), 2)


def test_alaw_encodes_every_sample_as_the_reference_does() -> None:
    assert alaw_encode(EVERY_SAMPLE) == audioop.lin2alaw(EVERY_SAMPLE.tobytes(), 2)


def test_ulaw_decodes_every_code_as_the_reference_does() -> None:
    decoded = ulaw_decode(EVERY_CODE)
    assert decoded.dtype == np.int16
    assert decoded.tobytes() == audioop.ulaw2lin(EVERY_CODE, 2)


def test_alaw_decodes_every_code_as_the_reference_does() -> None:
    decoded = alaw_decode(EVERY_CODE)
    assert decoded.dtype == np.int16
    assert decoded.tobytes() == audioop.alaw2lin(EVERY_CODE, 2)


@pytest.mark.parametrize(("encode", "decode"), [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)])
def test_a_decoded_level_encodes_back_to_its_own_code(
    encode: Callable[[np.ndarray], bytes], decode: Callable[[bytes], np.ndarray]
) -> None:
    codes = np.frombuffer(EVERY_CODE, dtype=np.uint8)
    again = np.frombuffer(encode(decode(EVERY_CODE)), dtype=np.uint8)
    # u-law has two zeros (+0 0xFF and -0 0x7F); a zero sample encodes as +0.
    differing = set(codes[again != codes].tolist())
    assert differing <= {0x7F}


def test_a_speech_frame_survives_the_round_trip_within_the_quantisation_step() -> None:
    frame = (np.sin(2 * np.pi * 440 * np.arange(160) / 8000) * 12000).astype(np.int16)
    for encode, decode in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        payload = encode(frame)
        assert len(payload) == 160
        error = np.abs(decode(payload).astype(np.int32) - frame)
        assert error.max() <= np.abs(frame.astype(np.int32)).max() // 16  # G.711 keeps ~4 bits of mantissa


def test_a_frame_costs_a_few_microseconds() -> None:
    frame = (np.random.default_rng(1).standard_normal(160) * 3000).astype(np.int16)
    payload = ulaw_encode(frame)
    runs = 2000
    encode_s = min(timeit.repeat(lambda: ulaw_encode(frame), number=runs, repeat=3)) / runs
    decode_s = min(timeit.repeat(lambda: ulaw_decode(payload), number=runs, repeat=3)) / runs
    assert encode_s < 50e-6 and decode_s < 50e-6  # ~2 us measured; generous for loaded CI machines
