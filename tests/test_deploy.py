"""Export for inference (``gpuformer_lib.deploy``): the ``torch.export`` program and the ONNX model run by
ONNX Runtime, each against eager PyTorch at two shapes (the dynamic batch and length), the file written
where asked and never over an existing one, the latency result's arithmetic, and the clear errors (missing
package, wrong ids, no CUDA provider on a CPU build)."""

import os
import sys

import pytest
import torch

from fake_clock import FakeClock

from gpuformer_lib import bench, deploy
from gpuformer_lib.model import DecoderLM, TransformerConfig

try:
    deploy.require_onnx()
    HAVE_ONNX = True
except ImportError:
    HAVE_ONNX = False
# requirements.txt lists onnx, onnxscript and onnxruntime and `make test` (CI's command) installs it: a missing
# package is an error, never a silent skip of the ONNX Runtime-against-eager checks. Only an explicit
# GPUFORMER_SKIP_ONNX=1 (a deliberately minimal local install) turns them into skips.
if not HAVE_ONNX and not os.environ.get("GPUFORMER_SKIP_ONNX"):
    raise ImportError("onnx, onnxscript or onnxruntime is missing: install requirements.txt (CI does), or set "
                      "GPUFORMER_SKIP_ONNX=1 to skip the ONNX checks on purpose")
needs_onnx = pytest.mark.skipif(not HAVE_ONNX, reason="onnx, onnxscript and onnxruntime are not installed")

VOCAB = 37


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_decoder_layers=1, d_ff=64, dropout=0.1,
                               max_len=32, positional="learned", activation="gelu")
    return DecoderLM(config).eval()


def _ids(b, t, seed):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def program(lm):
    return deploy.export_program(lm, _ids(4, 16, 0))


@pytest.fixture(scope="module")
def onnx_file(program, tmp_path_factory):
    return deploy.export_onnx(program, tmp_path_factory.mktemp("onnx"))


def test_exported_program_matches_eager_at_other_shapes(lm, program):
    check = deploy.check_exported(program, lm, [_ids(4, 16, 1), _ids(3, 7, 2), _ids(1, 32, 3)])
    assert check.shapes == ((4, 16), (3, 7), (1, 32))
    assert check.max_abs_diff <= 1e-5  # the same ATen kernels: 0 or a few ulps
    assert not lm.training  # dropout off: export_program put the model in eval mode


def test_static_export_refuses_another_shape(lm):
    static = deploy.export_program(lm, _ids(2, 8, 0), dynamic=False)
    with pytest.raises(Exception, match="(?i)shape|size|guard|expected"):
        static.module()(_ids(3, 8, 1))


@needs_onnx
def test_onnx_runtime_matches_eager_on_two_shapes_and_times_both(lm, onnx_file):
    result = deploy.compare_onnx(lm, [_ids(4, 16, 4), _ids(2, 9, 5)], path=onnx_file, warmup=1, repeats=5)
    assert result.shapes == ((4, 16), (2, 9))
    assert result.within_tolerance and result.max_abs_diff <= deploy.ONNX_TOLERANCE
    # the comparison can fail: a changed model is far outside the tolerance
    changed = DecoderLM(lm.config).eval()
    with pytest.raises(AssertionError, match="tolerance"):
        deploy.compare_onnx(changed, [_ids(4, 16, 4)], path=onnx_file, warmup=0, repeats=1)
    assert result.eager_ms > 0 and result.ort_ms > 0
    assert result.speedup == pytest.approx(result.eager_ms / result.ort_ms)
    assert result.provider == "CPUExecutionProvider" and result.threads == 1
    assert result.file_bytes == onnx_file.stat().st_size > 4 * sum(p.numel() for p in lm.parameters()) * 0.9
    assert result.opset >= 18
    assert result.comparison.baseline == "eager" and result.comparison.candidate == "ONNX Runtime"


@needs_onnx
def test_onnx_timing_goes_through_the_interleaved_helper(lm, onnx_file, monkeypatch):
    # every timed call lasts one tick of a fake clock: equal times, so the verdict must be a tie, from 5 rounds
    monkeypatch.setattr(bench, "time", FakeClock(tick=1e-3))
    result = deploy.compare_onnx(lm, [_ids(4, 16, 4)], path=onnx_file, warmup=1, repeats=5)
    assert result.eager_ms == pytest.approx(1.0) and result.ort_ms == pytest.approx(1.0)
    assert len(result.comparison.ratios) == 5 and result.comparison.verdict == "no difference we can see"


@needs_onnx
def test_onnx_graph_has_dynamic_batch_and_length(onnx_file):
    onnx, _ = deploy.require_onnx()
    graph_input = onnx.load(str(onnx_file)).graph.input[0]
    dims = graph_input.type.tensor_type.shape.dim
    assert len(dims) == 2 and all(d.dim_param and not d.dim_value for d in dims)


@needs_onnx
def test_export_onnx_never_overwrites(program, onnx_file, tmp_path):
    size = onnx_file.stat().st_size
    with pytest.raises(FileExistsError, match="never overwrites"):
        deploy.export_onnx(program, onnx_file.parent, name=onnx_file.name)
    assert onnx_file.stat().st_size == size
    with pytest.raises(FileNotFoundError, match="existing folder"):
        deploy.export_onnx(program, tmp_path / "missing")
    with pytest.raises(ValueError, match=r"\.onnx"):
        deploy.export_onnx(program, tmp_path, name="model.txt")


@pytest.mark.parametrize("package", ["onnx", "onnxscript", "onnxruntime"])
def test_missing_package_says_how_to_install(monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=f"'{package}'.*pip install onnx onnxscript onnxruntime"):
        deploy.require_onnx()


def test_bad_inputs_are_refused(lm, program):
    with pytest.raises(ValueError, match=r"\.long\(\)"):
        deploy.export_program(lm, _ids(2, 8, 0).int())
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        deploy.check_exported(program, lm, [_ids(2, 8, 0)[0]])
    with pytest.raises(TypeError, match="ExportedProgram"):
        deploy.check_exported(lm, lm, [_ids(2, 8, 0)])


@needs_onnx
def test_bad_onnx_arguments_are_refused(lm):
    with pytest.raises(TypeError, match="ExportedProgram"):
        deploy.export_onnx(lm)
    with pytest.raises(ValueError, match="threads"):
        deploy.ort_session(__file__, threads=0)
    with pytest.raises(FileNotFoundError, match="export_onnx"):
        deploy.ort_session("/nonexistent/model.onnx")
    with pytest.raises(ValueError, match="tolerance"):
        deploy.compare_onnx(lm, [_ids(2, 8, 0)], tolerance=0)
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        deploy.ort_providers("meta")


@needs_onnx
def test_cuda_provider_refused_clearly_without_it():
    _, ort = deploy.require_onnx()
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert deploy.ort_providers("cuda")[0] == "CUDAExecutionProvider"
    else:
        with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
            deploy.ort_providers("cuda")
    assert deploy.ort_providers("cpu") == ["CPUExecutionProvider"]


def test_torch_threads_restores():
    before = torch.get_num_threads()
    with deploy.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_onnx_missing_names_every_missing_package_so_a_notebook_can_skip(monkeypatch):
    """A GPU node has onnx and onnxruntime but not onnxscript: chapter 16 can print this and skip its ONNX cells
    (before, its cell 18 failed with the first missing package only)."""
    assert deploy.onnx_missing() is None
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    message = deploy.onnx_missing()
    assert "'onnxscript', 'onnxruntime'" in message and "are not installed" in message and "pip install" in message
    with pytest.raises(deploy.OnnxUnavailableError, match="'onnxscript', 'onnxruntime'"):
        deploy.require_onnx()
    assert issubclass(deploy.OnnxUnavailableError, ImportError)
