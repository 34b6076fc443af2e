"""What the agent is and does: agent files and their templates, tools behind one interface (webhooks,
Python functions, built-ins: end call, transfer, DTMF), and signed event delivery."""
