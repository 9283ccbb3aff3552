import pytest
from campaign_kit import Templates


@pytest.fixture(scope="session")
def templates(tmp_path_factory) -> Templates:
    """Valid tiny checkpoints for the hostile-input campaign (test_campaign_*.py), built once and copied
    into the cases that damage them."""
    return Templates(tmp_path_factory.mktemp("campaign-templates"))
