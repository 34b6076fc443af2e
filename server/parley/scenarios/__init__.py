"""`parley test`: a team's agent tested by scripted (or LLM-played) callers over the real phone path.

A scenario file (scenario.py reads it) says who calls, over what line, what they say and when, what the
agent's tools answer, and what must hold. The runner (runner.py) places the call over a real transport
with a real caller, the line (line.py) impairs it as a phone line would, and expectations.py judges
what was heard; the reports (report_html.py, junit.py, progress.py) say what happened.
"""
