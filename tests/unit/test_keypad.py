"""Keypad entries: digits gathered the way a caller types a number."""

from __future__ import annotations

from parley.pipeline.keypad import KeypadEntry


def test_hash_ends_an_entry_and_is_kept() -> None:
    keypad = KeypadEntry(timeout_s=1.0)
    assert keypad.push("1", 0.0) is None
    assert keypad.push("2", 0.3) is None
    assert keypad.push("#", 0.5) == "12#"
    assert keypad.poll(9.0) is None


def test_an_entry_ends_when_no_key_follows_for_the_timeout() -> None:
    keypad = KeypadEntry(timeout_s=1.0)
    keypad.push("5", 0.0)
    assert keypad.poll(0.9) is None
    keypad.push("6", 0.9)
    assert keypad.poll(1.5) is None
    assert keypad.poll(1.95) == "56"


def test_anything_but_a_keypad_key_is_ignored() -> None:
    keypad = KeypadEntry(timeout_s=1.0)
    assert keypad.push("x", 0.0) is None
    assert keypad.poll(5.0) is None
