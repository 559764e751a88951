"""Security fixtures: the test PKI, once per test session."""

from __future__ import annotations

import pytest

from tools.pki import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))
