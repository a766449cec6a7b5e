"""Shared fixtures: every test starts with empty framejit caches and no log artifacts."""
import pytest

import framejit


@pytest.fixture(autouse=True)
def _fresh_framejit():
    framejit.reset()
    framejit.set_logs(handler=False)
    yield
    framejit.reset()
    framejit.set_logs(handler=False)
