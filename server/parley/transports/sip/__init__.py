"""SIP: a trunk endpoint (RFC 3261 UAS/UAC) with RTP media, in the service's process."""
