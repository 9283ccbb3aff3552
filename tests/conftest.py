import os

import pytest
import torch

DEVICE_ENV = "TFORMER_TEST_DEVICE"


def pytest_addoption(parser):
    parser.addoption("--device", default=None,
                     help=f"torch device for the device-generic tests (cpu, cuda, cuda:N); default ${DEVICE_ENV} or cpu")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
    # `tformer train` and `tformer profile` flush denormals for the whole process (right for a
    # command, which exits after); in-process tests must not pass that CPU state on to the next test.
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def device(request) -> torch.device:
    """Where the device-generic tests put their models and inputs: --device, else $TFORMER_TEST_DEVICE,
    else the CPU. The tests keep their fp32 tolerances on a GPU, so TF32 (a 10-bit mantissa in matmuls
    and convolutions) is switched off for the session."""
    name = request.config.getoption("--device") or os.environ.get(DEVICE_ENV) or "cpu"
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device {name} asked for, but torch.cuda.is_available() is False")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return dev
