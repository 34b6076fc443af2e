"""The files a recording is written as: WAV (16-bit PCM) or Ogg, Opus where the installed libsndfile
writes it (1.0.29 and later), else Vorbis."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache

import soundfile

log = logging.getLogger(__name__)

RATE = 16000  # both channels: the pipeline's rate, wideband for Opus; the agent's audio is resampled to it
CHANNELS = ("caller", "agent")  # left, right


@dataclass(frozen=True)
class RecordingFormat:
    name: str  # as --record-audio says it: "wav" or "ogg"
    extension: str
    container: str  # libsndfile's words
    subtype: str
    codec: str
    content_type: str


WAV = RecordingFormat("wav", "wav", "WAV", "PCM_16", "pcm_s16le", "audio/wav")
OPUS = RecordingFormat("ogg", "ogg", "OGG", "OPUS", "opus", "audio/ogg")
VORBIS = RecordingFormat("ogg", "ogg", "OGG", "VORBIS", "vorbis", "audio/ogg")


@cache
def recording_format(name: str) -> RecordingFormat:
    """The format for --record-audio's `wav` or `ogg` (Opus, or Vorbis where libsndfile has no Opus)."""
    if name == "wav":
        return WAV
    if "OPUS" in soundfile.available_subtypes("OGG"):
        return OPUS
    log.warning("recordings_in_vorbis: this libsndfile writes no Opus")
    return VORBIS
