"""Post-call analysis: what an agent file's `[analysis]` asks of each of its calls once it has ended (a
summary, a JSON-Schema-shaped extraction, a success verdict), asked of the process's LLM in the
background of the live calls, kept with the call's record and sent as a signed `call.analyzed` event.

- `analyses.py`: the registry's observer, the bounded queue and the worker that keeps and sends results;
- `analyst.py`: one call's questions put to the LLM, the answers checked against their schemas;
- `prompts.py`: the transcript as the model reads it, and the questions;
- `priority.py`: when the analysis may use the shared LLM (after every live call's work).
"""
