"""Chapter 1's roofline exercises: rows at the ridge, two compute roofs, the add's and the product's times."""

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import roofline
from gpuformer_lib.exercises.roofline import TWO_ROOF_OPERATIONS

# --------------------------------------------------------------------------- 1.2: rows at the ridge

RIDGES = roofline._prediction_ridges()  # the notebook's: datasheet tensor-core ridges, T4 fp16 and H100 bf16
CUDA_RIDGES = roofline._prediction_ridges(tensor_cores=False)
K = N = 4096


def rows(ridge: float, b: int = 2) -> float:
    """The chapter's solution: 2mkn / (b(mk + kn + mn)) = R solved for m."""
    return ridge * b * K * N / (2 * K * N - ridge * b * (K + N))


def per_gpu(rule):
    return {gpu: rule(gpu) for gpu in RIDGES}


RIGHT_ROWS = per_gpu(lambda gpu: rows(RIDGES[gpu]))
T4, H100 = RIDGES

# --------------------------------------------------------------------------- 1.3: two compute roofs

TENSOR_RIDGE = roofline.H100_TENSOR_BF16 / roofline.H100_BANDWIDTH
CUDA_RIDGE = roofline.H100_CUDA_CORE_FP32 / roofline.H100_BANDWIDTH


def sides(rule):
    """Answers for every operation of exercise 1.3: ``rule(intensity, tensor_cores)`` says compute-bound."""
    return {op: "compute" if rule(i, tc) else "memory" for op, (i, tc) in TWO_ROOF_OPERATIONS.items()}


RIGHT_SIDES = sides(lambda i, tc: i > (TENSOR_RIDGE if tc else CUDA_RIDGE))

# --------------------------------------------------------------------------- 1.4: the add and the product

# this device's measurements, fixed: main memory 12 GB/s, best float32 product 150 GFLOP/s (a laptop CPU)
ELEMENTS, BANDWIDTH, BEST_FP32, N_PREDICT = 2**24, 12e9, 150e9, 512
ADD_SECONDS = 12 * ELEMENTS / BANDWIDTH
MATMUL_SECONDS = 2 * N_PREDICT**3 / BEST_FP32


def add_time(predicted):
    # the timing (shown, not graded) as the page measured it: 0.74 of the model, a cache held part of it
    return roofline.check_add_time_prediction(predicted, 0.74 * ADD_SECONDS, elements=ELEMENTS,
                                              bandwidth=BANDWIDTH, peak_flops=BEST_FP32)


def matmul_time(predicted):
    return roofline.check_matmul_time_prediction(predicted, 0.99 * MATMUL_SECONDS, n=N_PREDICT,
                                                 peak_flops=BEST_FP32, bandwidth=BANDWIDTH)


TABLES = [
    Table(
        "check_ridge_rows", roofline.check_ridge_rows,
        right=(RIGHT_ROWS, {gpu: round(m) for gpu, m in RIGHT_ROWS.items()},
               {gpu: int(m) + 1 for gpu, m in RIGHT_ROWS.items()}),  # the first whole row past the ridge
        wrong=(Wrong("the ridge itself", {**RIGHT_ROWS, T4: RIDGES[T4]}, ("ridge itself", "not a row count")),
               Wrong("the square formula 2n/(3b)", {**RIGHT_ROWS, T4: 3 * RIDGES[T4]}, ("square", "thin")),
               Wrong("the GPUs swapped", {T4: RIGHT_ROWS[H100], H100: RIGHT_ROWS[T4]}, ("swapped",)),
               Wrong("the CUDA-core ridge", per_gpu(lambda gpu: rows(CUDA_RIDGES[gpu])), ("CUDA-core ridge",)),
               Wrong("4 bytes per element", per_gpu(lambda gpu: rows(RIDGES[gpu], b=4)), ("4 bytes per element",)),
               Wrong("the write of C left out", per_gpu(lambda gpu: RIDGES[gpu] * 2 * N / (2 * N - 2 * RIDGES[gpu])),
                     ("write of C",)),
               Wrong("a guess far off", {**RIGHT_ROWS, T4: 1000}, ("too high", "solve for m"))),
    ),
    Table(
        "check_bound_two_roofs", roofline.check_bound_two_roofs,
        right=(RIGHT_SIDES, {op: side.upper() for op, side in RIGHT_SIDES.items()}),
        wrong=(Wrong("everything against the tensor-core ridge", sides(lambda i, tc: i > TENSOR_RIDGE),
                     ("tensor-core ridge", "CUDA cores")),
               Wrong("everything against the CUDA-core ridge", sides(lambda i, tc: i > CUDA_RIDGE),
                     ("CUDA-core ridge", "tensor cores")),
               Wrong("every product compute-bound", {op: "compute" if op.startswith("matmul") else "memory"
                                                     for op in TWO_ROOF_OPERATIONS},
                     ("Not every matrix product is compute-bound",)),
               Wrong("upside down", sides(lambda i, tc: i < (TENSOR_RIDGE if tc else CUDA_RIDGE)), ("Upside down",)),
               Wrong("the decoding step compute-bound",
                     {**RIGHT_SIDES, next(op for op in TWO_ROOF_OPERATIONS if "decoding" in op): "compute"},
                     ("decoding step", "memory-bound"))),
    ),
    Table(
        "check_add_time_prediction", add_time,
        right=(ADD_SECONDS, 3 * 4 * ELEMENTS / BANDWIDTH, round(ADD_SECONDS, 4)),
        wrong=(Wrong("the write forgotten (8 bytes)", 8 * ELEMENTS / BANDWIDTH, ("write", "12 bytes per element")),
               Wrong("one tensor (4 bytes)", 4 * ELEMENTS / BANDWIDTH, ("three float32 tensors",)),
               Wrong("the compute roof", ELEMENTS / BEST_FP32, ("memory-bound", "compute roof")),
               Wrong("bandwidth taken in GB/s", 12 * ELEMENTS / (BANDWIDTH / 1e9), ("not GB/s",)),
               Wrong("float64's 24 bytes", 24 * ELEMENTS / BANDWIDTH, ("float32",)),
               Wrong("write-allocate's 16 bytes", 16 * ELEMENTS / BANDWIDTH, ("too high", "12 per float32"))),
    ),
    Table(
        "check_matmul_time_prediction", matmul_time,
        right=(MATMUL_SECONDS, 2 * N_PREDICT * N_PREDICT * N_PREDICT / BEST_FP32, round(MATMUL_SECONDS, 5)),
        wrong=(Wrong("n^3 FLOPs", N_PREDICT**3 / BEST_FP32, ("2 FLOPs", "2 n^3")),
               Wrong("the memory roof", 3 * N_PREDICT**2 * 4 / BANDWIDTH, ("compute-bound", "ridge")),
               Wrong("GFLOP/s taken for FLOP/s", 2 * N_PREDICT**3 / (BEST_FP32 / 1e9), ("not GFLOP/s",)),
               Wrong("the rate over the FLOPs", BEST_FP32 / (2 * N_PREDICT**3), ("denominator",)),
               Wrong("n^2 FLOPs", 2 * N_PREDICT**2 / BEST_FP32, ("too low", "2 n^3"))),
    ),
]
