"""Answering-machine detection's pure parts: the classifier over items in audio time (amd.py), the tone
and speech trackers (amd_audio.py), and the agent file's [voicemail] table (agent/voicemail.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parley.agent.agentfile import AgentFileError, load_agent_file
from parley.amd import Classifier, words_say
from parley.amd_audio import SpeechTracker, ToneTracker, tone_in
from parley.audio import ulaw_decode, ulaw_encode

RATE = 16000
CHUNK_S = 512 / RATE


def run(classifier: Classifier, until_s: float, step_s: float = 0.032) -> float | None:
    """Ask for a verdict every chunk up to `until_s`; when it came (None: no verdict)."""
    now = 0.0
    while now <= until_s:
        if classifier.decide(now) is not None:
            return now
        now += step_s
    return None


# the classifier


def test_a_short_hello_then_the_pause_of_someone_waiting_is_a_person() -> None:
    amd = Classifier()
    amd.speech_began(0.6)
    amd.speech_ended(1.1)  # "Hello?"
    amd.heard("Hello?", 1.4)
    assert run(amd, 1.85) is None  # not before the pause is long enough
    verdict = amd.decide(1.95)
    assert verdict is not None and verdict.result == "human" and verdict.reason == "short_answer"
    assert verdict.decided_s == pytest.approx(1.95)


def test_a_greeting_that_talks_on_is_a_machine_by_the_cap_and_words_decide_it_earlier() -> None:
    amd = Classifier()
    amd.speech_began(0.3)
    amd.speech_ended(1.6)
    amd.speech_began(1.9)  # a short pause between sentences: the same stretch of speech
    assert run(amd, 4.9) is None  # no words yet: it could still be a menu
    verdict = amd.decide(5.0)
    assert verdict is not None and (verdict.result, verdict.reason) == ("machine", "long_greeting")

    worded = Classifier()
    worded.speech_began(0.3)
    worded.heard("Hi, you've reached Dana. I can't take your call, please leave a message", 2.6)
    verdict = worded.decide(2.6)
    assert verdict is not None and (verdict.result, verdict.reason) == ("machine", "words")


def test_a_menu_is_an_ivr_and_a_beep_is_a_machine_whatever_was_said() -> None:
    menu = Classifier()
    menu.speech_began(0.2)
    menu.heard("Thank you for calling Acme. For sales, press 1.", 3.0)
    verdict = menu.decide(3.0)
    assert verdict is not None and verdict.result == "ivr"

    beeped = Classifier()
    beeped.speech_began(0.2)
    beeped.speech_ended(1.0)
    beeped.tone(1.3, 1.4)
    assert beeped.decide(1.4) is None  # 0.1 s of tone is not yet a beep
    beeped.tone(1.3, 1.52)
    verdict = beeped.decide(1.52)
    assert verdict is not None and (verdict.result, verdict.reason) == ("machine", "beep")
    assert beeped.beep_s == pytest.approx(1.3)


def test_words_a_greeting_and_a_menu_share_keep_a_short_first_sentence_from_passing_for_a_person() -> None:
    amd = Classifier()
    amd.speech_began(0.3)
    amd.speech_ended(1.3)  # "You've reached Dana." then a long breath
    amd.heard("You've reached Dana.", 1.6)
    assert run(amd, 4.9) is None
    verdict = amd.decide(5.0)
    assert verdict is not None and verdict.result == "machine"

    opening = Classifier()  # a business's menu, its keys still to come
    opening.speech_began(0.3)
    opening.heard("Thank you for calling Acme.", 2.0)
    assert run(opening, 4.9) is None
    verdict = opening.decide(5.0)
    assert verdict is not None and verdict.result == "ivr"


def test_a_longer_answer_ending_in_a_question_is_a_person_and_silence_is_unknown() -> None:
    amd = Classifier()
    amd.speech_began(0.3)
    amd.speech_ended(2.9)
    amd.heard("Hello, this is Dana Smith speaking, who is calling?", 3.2)
    verdict = amd.decide(3.75)
    assert verdict is not None and (verdict.result, verdict.reason) == ("human", "question")

    quiet = Classifier()
    assert run(quiet, 2.4) is None
    verdict = quiet.decide(2.5)
    assert verdict is not None and (verdict.result, verdict.reason) == ("unknown", "silence")


def test_transcripts_are_asked_at_a_pause_and_while_long_speech_goes_on_never_after_the_verdict() -> None:
    amd = Classifier()
    assert not amd.transcript_due(1.0)
    amd.speech_began(0.5)
    assert not amd.transcript_due(1.0)
    assert amd.transcript_due(1.8)  # 1.2 s of speech so far
    amd.heard("Hi, this is", 1.8)
    assert not amd.transcript_due(2.0)
    amd.speech_ended(2.2)
    assert amd.transcript_due(2.5)
    amd.heard("Hi, this is Dana.", 2.5)
    assert not amd.transcript_due(2.6)
    amd.decide(3.1)
    assert amd.verdict is not None and not amd.transcript_due(5.0)


def test_the_message_waits_for_the_end_of_the_beep_or_the_greetings_quiet_or_the_cap() -> None:
    amd = Classifier()
    amd.speech_began(0.2)
    amd.heard("please leave a message after the tone", 3.0)
    amd.decide(3.0)
    amd.speech_ended(5.0)
    assert amd.message_due(5.5) is None  # a beep may still come
    amd.tone(5.6, 5.9)
    assert amd.message_due(7.0) is None  # the beep is sounding: however long the quiet
    amd.tone_ended(6.1)
    assert amd.message_due(6.1) == "beep"

    no_beep = Classifier()
    no_beep.speech_began(0.2)
    no_beep.heard("leave a message", 2.0)
    no_beep.decide(2.0)
    no_beep.speech_ended(4.0)
    assert no_beep.message_due(5.0) is None
    assert no_beep.message_due(5.7) == "quiet"

    talker = Classifier()
    talker.speech_began(0.2)
    talker.heard("voicemail", 2.0)
    talker.decide(2.0)
    assert talker.message_due(29.0) is None
    assert talker.message_due(30.0) == "cap"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("Hi, you've reached Dana. Please leave a message after the tone.", "machine"),
        ("The person you are calling is not available.", "machine"),
        ("Sorry I can't come to the phone right now.", "machine"),
        ("Thanks for calling. Nobody can come to the phone right now.", "machine"),
        ("For sales, press 1. For support, press 2.", "ivr"),
        ("Para español, oprima nueve.", "ivr"),
        ("Thank you for calling Acme.", "opening"),
        ("You've reached Dana.", "recorded"),
        ("Hello?", ""),
        ("Hi, this is Dana.", ""),
    ],
)
def test_what_words_alone_say(text: str, says: str) -> None:
    assert words_say(text) == says


# what is heard in the audio


def sine(hz: float, seconds: float, level: float = 8000.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * hz * t) * level).astype(np.int16)


def chunks(pcm: np.ndarray) -> list[np.ndarray]:
    return [pcm[i : i + 512] for i in range(0, pcm.size - 511, 512)]


def phone_line(pcm: np.ndarray) -> np.ndarray:
    return ulaw_decode(ulaw_encode(pcm))


def test_a_beep_is_found_at_its_frequency_over_a_phone_line_and_two_tones_or_noise_are_not() -> None:
    found = tone_in(phone_line(sine(1000, 0.032)), RATE)
    assert found is not None and abs(found.hz - 1000) < 15
    dual = phone_line(sine(697, 0.032, 5000) + sine(1209, 0.032, 5000))  # a keypad's "1"
    assert tone_in(dual, RATE) is None
    noise = np.random.default_rng(1).normal(0, 3000, 512).astype(np.int16)
    assert tone_in(noise, RATE) is None
    assert tone_in(sine(1000, 0.032, 30), RATE) is None  # line noise, whatever its spectrum


def test_the_tone_tracker_reports_a_beeps_start_and_its_end() -> None:
    audio = np.concatenate([np.zeros(RATE // 2, np.int16), sine(850, 0.5), np.zeros(RATE // 2, np.int16)])
    tracker = ToneTracker(RATE)
    items = [(i, tracker.push(c, i * CHUNK_S)) for i, c in enumerate(chunks(phone_line(audio)))]
    tones = [item for _, item in items if item is not None and item[0] == "tone"]
    ended = [item for _, item in items if item is not None and item[0] == "ended"]
    assert tones and tones[0][1] == pytest.approx(0.5, abs=0.04)
    assert len(ended) == 1 and ended[0][1] == pytest.approx(1.0, abs=0.04)


def test_speech_segments_come_from_the_vad_probabilities_with_a_hangover() -> None:
    tracker = SpeechTracker(CHUNK_S)
    probabilities = [0.0] * 5 + [0.9] * 10 + [0.1] * 2 + [0.8] * 3 + [0.0] * 10 + [0.95] + [0.0] * 10
    items = [tracker.push(p, i * CHUNK_S) for i, p in enumerate(probabilities)]
    found = [item for item in items if item is not None]
    assert found[0] == ("began", pytest.approx(5 * CHUNK_S))
    assert found[1] == ("ended", pytest.approx(20 * CHUNK_S))  # the two-chunk dip is inside the segment
    assert len(found) == 2  # a single loud chunk is a click


# the agent file


def agent_file(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "dialler.toml"
    path.write_text(f'system_prompt = "You call customers."\n\n[voicemail]\n{table}\n')
    return path


def test_voicemail_keys_are_read_and_checked_with_the_line_named(tmp_path: Path) -> None:
    agent = load_agent_file(agent_file(tmp_path, 'detect = true\nmessage = "Hi {name}, Acme here."'))
    voicemail = agent.voicemail
    assert voicemail.detect and voicemail.on_machine == "leave_message" and voicemail.message
    assert (voicemail.on_ivr, voicemail.on_unknown) == ("talk", "talk")
    assert load_agent_file(agent_file(tmp_path, "detect = true")).voicemail.on_machine == "hang_up"
    for table, line, words in (
        ('detect = "yes"', 4, "detect must be true or false"),
        ('on_machine = "leave_message"', 4, "needs a message"),
        ('on_ivr = "press 1"', 4, 'on_ivr must be "talk" or "hang_up"'),
        ("beep_hz = 1000", 4, "unknown key 'beep_hz'"),
    ):
        with pytest.raises(AgentFileError, match=rf"dialler.toml, line {line}: .*{words}"):
            load_agent_file(agent_file(tmp_path, table))


# the floor: no reply while the check decides, nor to a machine


class Floor:
    def __init__(self) -> None:
        self.open = False

    def listening(self) -> bool:
        return self.open


def test_while_the_floor_is_shut_a_turn_starts_no_reply_cuts_nothing_and_cannot_be_reopened() -> None:
    from parley.call_signals import CallSignals
    from parley.pipeline.history import Conversation
    from parley.pipeline.messages import Transcript, Utterance
    from parley.pipeline.turns import SpeculativeTurnTracker
    from parley.replies import Replies
    from parley.turn_decisions import TurnDecisions
    from tests.unit.test_turn_decisions import AUDIO, Inboxes

    signals = CallSignals("c-1")
    events: list[dict[str, object]] = []
    signals.watch(events.append)
    inboxes, tracker, floor = Inboxes(), SpeculativeTurnTracker(), Floor()
    conversation = Conversation("You help.", 8)
    replies = Replies("c-1", signals, inboxes, tracker, conversation, 8000)
    decisions = TurnDecisions(
        "c-1", replies, inboxes, signals, tracker, conversation, speculative=True, floor=floor
    )
    replies.say("Hi, this is Acme.")  # the voicemail message playing
    assert not decisions.agent_active()  # speech over it is no barge-in
    turn = decisions.open_turn()
    tracker.observe(turn, 0)
    decisions.user_started_speaking()
    decisions.speech_paused(turn, 0, AUDIO, speech_end=1.0)
    decisions.turn_ended(turn, 0, AUDIO, speech_end=1.0)
    decisions.keys_entered("1")
    assert not [i for i in inboxes.items if isinstance(i, Utterance | Transcript)]
    assert tracker.is_committed(turn, 0) and tracker.begin_reopen_candidate(turn, 0) is None
    assert "user_speaking" not in [e.get("state") for e in events]

    begun = decisions.open_turn()  # "Hello?" begins while the check decides ...
    tracker.observe(begun, 0)
    floor.open = True  # ... a person answered: the call goes on as any other
    decisions.turn_ended(begun, 0, AUDIO, speech_end=1.5)  # ... and the hello is still not a question
    assert not [i for i in inboxes.items if isinstance(i, Utterance | Transcript)]
    assert decisions.agent_active()
    turn = decisions.open_turn()
    tracker.observe(turn, 0)
    decisions.turn_ended(turn, 0, AUDIO, speech_end=2.0)
    assert [i for i in inboxes.items if isinstance(i, Utterance)]
