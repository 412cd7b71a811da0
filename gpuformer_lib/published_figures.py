"""The registry's entries: published GPU figures, one tuple per topic (see :mod:`gpuformer_lib.published`).

Add a figure only from a source you opened and read yourself, with a verbatim quote that contains the
number. Keys are unique; ``tests/test_published.py`` checks every entry and that the book's appendix page
(``book/published_figures.md``, written by ``python -m gpuformer_lib.published``) lists them all.
"""

from gpuformer_lib.published import PublishedFigure as F

_T4_DEVICEQUERY = dict(
    hardware="NVIDIA Tesla T4 (1 GPU)", software="CUDA driver 12.2, CUDA runtime 11.8 (deviceQuery sample)",
    url="https://gist.github.com/Terminus-IMRC/5e4b7782c27106dec287050b323cd059",
    title="deviceQuery output on a Tesla T4 (GitHub gist, Terminus-IMRC)", where="the output listing, Device 0",
    chapters=(0,))

SETUP = (
    # GPUs a learner meets: memory, compute capability, what a host sync or a transfer costs
    F(key="t4-devicequery-global-memory", value=15102, unit="MBytes", quantity="GPU memory the driver reports",
      quote="Total amount of global memory: 15102 MBytes (15835660288 bytes)",
      note="15835660288 bytes = 14.75 GiB: less than the 16 GB on the box, which is why the course's T4 "
           "profile says 14.7 GiB and why 'fits on a 16 GB T4' must be checked against about 14.7 GiB.",
      **_T4_DEVICEQUERY),
    F(key="t4-devicequery-sm-count", value=40, unit="SMs", quantity="streaming multiprocessors",
      quote="(040) Multiprocessors, (064) CUDA Cores/MP: 2560 CUDA Cores",
      note="A kernel launched with fewer than 40 blocks leaves SMs of a T4 idle.", **_T4_DEVICEQUERY),
    F(key="t4-devicequery-compute-capability", value=7.5, unit="(major.minor)", quantity="compute capability",
      quote="CUDA Capability Major/Minor version number: 7.5",
      note="Below 8.0: fp16 tensor cores, no bf16 or TF32 tensor cores. The same output shows a driver "
           "(12.2) newer than the runtime the program was built with (11.8), which is allowed.",
      **_T4_DEVICEQUERY),
    F(key="h100-compute-capability", value=9.0, unit="(major.minor)", quantity="compute capability",
      hardware="NVIDIA H100 (every form factor)", software="not stated",
      url="https://developer.nvidia.com/cuda-gpus", title="CUDA GPU Compute Capability (NVIDIA Developer)",
      where="the compute-capability table, row 9.0, Data Center column",
      quote="9.0 | NVIDIA GH200 NVIDIA H200 NVIDIA H100", chapters=(0,),
      note="9.0 (Hopper): bf16, fp16, TF32 and FP8 tensor cores; FlashAttention kernels need 8.0 or newer."),
)

HARDWARE = (
    # datasheet peaks and bandwidths; measured matrix-product rates and copy bandwidths
)

KERNELS = (
    # kernels: bandwidth reached, occupancy, Triton and CUDA kernel benchmarks
)

ATTENTION = (
    # fused attention, FlashAttention, the memory of explicit attention
)

HEADS = (
    # multi-head, MQA/GQA, the KV cache, decoding speed
)

MODEL = (
    # layers and model step times, positional encodings, tensor-core-friendly shapes
)

OPTIMIZERS = (
    # optimizer memory and step time, losses, clipping
)

FIGURES: tuple[F, ...] = SETUP + HARDWARE + KERNELS + ATTENTION + HEADS + MODEL + OPTIMIZERS
