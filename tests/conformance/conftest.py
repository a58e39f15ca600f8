from __future__ import annotations

import pytest

from tests.conftest import shared_spark


@pytest.fixture(autouse=True, scope="session")
def _spark_session():
    return shared_spark()
