"""`parley test`: a team's agent tested by scripted (or LLM-played) callers over the real phone path.

A scenario file (scenario_file.py reads it into scenario.py's values) says who calls, over what line,
what they say and when, what the agent's tools answer (tool_mocks.py), and what must hold. The runner
(runner.py) places the call over a real transport with a real caller, the line (line.py) impairs it as a
phone line would, findings.py puts together what the call's record and the caller's ears say, and
expectations.py judges it; the reports (report_html.py, junit.py, progress.py) say what happened.
"""
