"""Chapter 16's exercise checks, beyond their tables of right and wrong answers (tests/answer_tables/tools.py):
the int8 model against a real quantized checkpoint, and the notes a passing wheel index gets."""

from gpuformer_lib import compression
from gpuformer_lib.exercises.tools import check_int8_size_prediction, check_wheel_for_driver, predicted_int8_size_ratio
from gpuformer_lib.model import DecoderLM


def test_int8_size_model_is_near_a_real_quantized_checkpoint_and_graded_against_the_model():
    model = DecoderLM(compression.demo_config(40, d_model=64))
    share = compression.linear_share(model)
    quantized, _ = compression.torch_quantize_dynamic(model)
    measured = compression.state_dict_bytes(model) / compression.state_dict_bytes(quantized)
    predicted = predicted_int8_size_ratio(share)
    assert 1 < predicted < 4 and abs(predicted / measured - 1) < 0.15, (predicted, measured)
    result = check_int8_size_prediction(predicted, measured, linear_share=share)
    assert result and f"{measured:.3g} x" in result.message  # the measurement is shown beside the model
    assert not check_int8_size_prediction(None, measured, linear_share=share)


def test_a_passing_wheel_index_says_which_torch_to_pin():
    best = check_wheel_for_driver("https://download.pytorch.org/whl/cu124")
    assert best and "newest tag it runs" in best.message and "2.6" in best.message
    older = check_wheel_for_driver("https://download.pytorch.org/whl/cu121/")
    assert older and "pin" in older.message and "cu124 is the newest" in older.message
    old_major = check_wheel_for_driver("https://download.pytorch.org/whl/cu118")
    assert old_major and "2.7" in old_major.message
