import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
    # `tformer train` and `tformer profile` flush denormals for the whole process (right for a
    # command, which exits after); in-process tests must not pass that CPU state on to the next test.
    torch.set_flush_denormal(False)
