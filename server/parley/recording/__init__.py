"""Call recordings: two channels (the caller left, the agent right as heard), written off the media path
to a folder or to S3-compatible storage. recordings.py is the way in."""

from parley.recording.call_recording import NOT_RECORDED, CallRecording, Recording
from parley.recording.recordings import Recorder, Recordings

__all__ = ["NOT_RECORDED", "CallRecording", "Recorder", "Recording", "Recordings"]
