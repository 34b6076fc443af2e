"""parley: a real-time voice agent you can call from a browser or a phone, and interrupt at any moment."""

__version__ = "0.1.0"
