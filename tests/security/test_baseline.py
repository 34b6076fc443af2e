"""The check every attack test ends with works on an untouched service: OPTIONS answered, a call made."""

from __future__ import annotations

from tests.security.conftest import Start


async def test_an_untouched_service_answers_options_and_completes_calls(start: Start) -> None:
    service = await start()
    await service.still_serves()
    await service.call_completes("TCP")
