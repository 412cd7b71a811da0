"""The registry's entries: published GPU figures, one tuple per topic (see :mod:`gpuformer_lib.published`).

Add a figure only from a source you opened and read yourself, with a verbatim quote that contains the
number. Keys are unique; ``tests/test_published.py`` checks every entry and that the book's appendix page
(``book/published_figures.md``, written by ``python -m gpuformer_lib.published``) lists them all.
"""

# Each entry is the keyword arguments of a gpuformer_lib.published.PublishedFigure, which checks it when
# published.figures() builds the registry: this module imports nothing, so the two do not import each other.
F = dict

_T4_DEVICEQUERY = dict(
    hardware="NVIDIA Tesla T4 (1 GPU)", software="CUDA driver 12.2, CUDA runtime 11.8 (deviceQuery sample)",
    url="https://gist.github.com/Terminus-IMRC/5e4b7782c27106dec287050b323cd059",
    title="deviceQuery output on a Tesla T4 (GitHub gist, Terminus-IMRC)", where="the output listing, Device 0",
    chapters=(0,))

SETUP = (
    # GPUs a learner meets: memory, compute capability, what a host sync or a transfer costs
    F(key="t4-devicequery-global-memory", value=15102, unit="MBytes", quantity="GPU memory the driver reports",
      quote="Total amount of global memory: 15102 MBytes (15835660288 bytes)",
      note="15835660288 bytes = 14.75 GiB: less than the 16 GiB the card carries, mostly because ECC takes 6.25 % "
           "of GDDR memory (gddr-ecc-capacity-reduction), the rest kept by the driver; the course's T4 profile "
           "says 14.7 GiB, and 'fits on a 16 GB T4' must be checked against about 14.7 GiB.",
      **_T4_DEVICEQUERY),
    F(key="t4-memory-announced", value=16, unit="GB", quantity="GPU memory on the card (as announced)",
      hardware="NVIDIA Tesla T4", software="not stated (an announced figure)",
      url="https://www.tomshardware.co.uk/nvidia-tesla-t4-turing-gpu,news-59152.html",
      title="Tom's Hardware: Nvidia Announces Tesla T4 GPUs With Turing Architecture",
      where="the article's text; a secondary source (a press report of NVIDIA's GTC Japan 2018 announcement)",
      quote="The Tesla T4 GPU comes bristling with 16GB of GDDR6", chapters=(0,),
      note="GDDR6: the ECC note below applies. Memory chips come in powers of two: the memory deviceQuery "
           "reports with ECC's 6.25 % added back is more than 16e9 bytes, so the card's '16GB' is 16 GiB."),
    F(key="gddr-ecc-capacity-reduction", value=6.25, unit="%",
      quantity="share of DRAM that holds ECC bits on GDDR memory with ECC enabled",
      hardware="NVIDIA GPUs with GDDR memory (the T4 has GDDR6)",
      software="CUDA documentation (version not stated in the text read)",
      url="https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html",
      title="CUDA C++ Best Practices Guide",
      where="section 9.2.1 Theoretical Bandwidth Calculation, the note on ECC (read in a copy of the guide's "
            "text kept in a public repository)",
      quote="On GPUs with GDDR memory with ECC enabled the available DRAM is reduced by 6.25% to allow for the "
            "storage of ECC bits.",
      chapters=(0,),
      note="6.25 % is 1/16: a 16 GiB T4 with ECC on offers at most 15 GiB; the same note says HBM2 memories "
           "have dedicated ECC resources, without that overhead."),
    F(key="t4-devicequery-sm-count", value=40, unit="SMs", quantity="streaming multiprocessors",
      quote="(040) Multiprocessors, (064) CUDA Cores/MP: 2560 CUDA Cores",
      note="A kernel launched with fewer than 40 blocks leaves SMs of a T4 idle.", **_T4_DEVICEQUERY),
    F(key="t4-devicequery-compute-capability", value=7.5, unit="(major.minor)", quantity="compute capability",
      quote="CUDA Capability Major/Minor version number: 7.5",
      note="Below 8.0: fp16 tensor cores, no bf16 or TF32 tensor cores. The same output shows a driver "
           "(12.2) newer than the runtime the program was built with (11.8), which is allowed.",
      **_T4_DEVICEQUERY),
    F(key="h100-compute-capability", value=9.0, unit="(major.minor)", quantity="compute capability",
      hardware="NVIDIA H100", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/hopper-tuning-guide/index.html",
      title="Tuning CUDA Applications for Hopper GPU Architecture (NVIDIA Hopper Tuning Guide)",
      where="section 1.4.1.1 Occupancy",
      quote="For devices of compute capability 9.0 (H100 GPUs), shared memory capacity per SM is 228 KB",
      chapters=(0,),
      note="9.0 (Hopper): bf16, fp16, TF32 and FP8 tensor cores; FlashAttention kernels need 8.0 or newer."),
)

HARDWARE = (
    # datasheet peaks and bandwidths; measured matrix-product rates and copy bandwidths
    F(key="h100-sxm-bf16-dense-peak", value=989, unit="TFLOPS", quantity="dense BF16 Tensor Core peak (no sparsity)",
      hardware="NVIDIA H100 SXM", software="not stated (a datasheet figure)",
      url="https://github.com/stas00/ml-engineering/blob/b9e29720eebd4aa946fa9678975385efbc90a777/compute/accelerator/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Accelerators",
      where="TFLOPS comparison table (theoretical peak, w/o sparsity; columns fp32, tf32, fp16, bf16, fp8, int8); "
            "a secondary source restating NVIDIA's datasheet, the same figure the course's datasheet table uses",
      quote="| NVIDIA H100 SXM       |  67.0 |  494.5 |  989 |  989 | 1979 | 1979 |", chapters=(1,),
      note="Secondary source (a book restating NVIDIA's datasheet; no NVIDIA primary source was found in the "
           "searchable corpora). It is the course's datasheet figure (bench.known_gpus uses 989.4), shown beside "
           "predictions, which use the measured rate below; it checks that figure, not the predictor. NVIDIA's own H100 page prints 1,979 TFLOPS for BF16, a figure with "
           "2:4 sparsity; dense is half."),
    F(key="h100-sxm-fp32-peak", value=67.0, unit="TFLOPS", quantity="float32 peak on CUDA cores (no tensor cores)",
      hardware="NVIDIA H100 SXM", software="not stated (a datasheet figure)",
      url="https://github.com/stas00/ml-engineering/blob/b9e29720eebd4aa946fa9678975385efbc90a777/compute/accelerator/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Accelerators",
      where="TFLOPS comparison table (theoretical peak, w/o sparsity), fp32 column; a secondary source restating "
            "NVIDIA's datasheet, the same figure the course's datasheet table uses",
      quote="| NVIDIA H100 SXM       |  67.0 |  494.5 |  989 |  989 | 1979 | 1979 |", chapters=(1,),
      note="Secondary source (a book restating NVIDIA's datasheet; no NVIDIA primary source was found in the "
           "searchable corpora), and the course's datasheet figure, shown beside predictions (an H100's predicted "
           "rate is the course's own measured one); it checks that figure, not the predictor. The roof of element-wise and row-wise kernels (softmax, layer norm, GELU, adds), which do not run on "
           "tensor cores."),
    F(key="h100-sxm-hbm-bandwidth", value=3.35, unit="TB/s", quantity="HBM3 memory bandwidth (datasheet peak)",
      hardware="NVIDIA H100 SXM", software="not stated (a datasheet figure)",
      url="https://github.com/stas00/ml-engineering/blob/b9e29720eebd4aa946fa9678975385efbc90a777/compute/accelerator/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Accelerators",
      where="Accelerator memory size and speed; a secondary source restating NVIDIA's datasheet, the same figure "
            "the course's datasheet table uses",
      quote="For example, A100-SXM comes with HBM2 at 1.6TBps, and H100-SXM comes with HBM3 at 3.35TBps",
      chapters=(1,),
      note="Secondary source (a book restating NVIDIA's datasheet; no NVIDIA primary source was found in the "
           "searchable corpora), and the course's datasheet figure, shown beside predictions (an H100's predicted "
           "bandwidth is the course's own measured copy); it checks that figure, not the predictor."),
    F(key="h100-sxm-bf16-matmul-measured", value=794.5, unit="TFLOPS",
      quantity="measured BF16 matrix-product rate (maximum achievable matmul FLOPS, best shape of a search)",
      hardware="NVIDIA H100 SXM", software="torch 2.7.0+cu126",
      url="https://github.com/stas00/ml-engineering/blob/b9e29720eebd4aa946fa9678975385efbc90a777/compute/accelerator/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Accelerators",
      where="Maximum Achievable Matmul FLOPS comparison table, BF16 (columns MAMF, Theory, Efficiency, Best Shape "
            "MxNxK, torch ver)",
      quote="| NVIDIA H100 SXM  |  794.5 |    989 |      80.3% |   2048x2048x13312 | 2.7.0+cu126     |",
      chapters=(1, 10),
      note="Mean of 100 iterations after 50 warm-up ones at the best of a brute-force search of shapes, measured "
           "with mamf-finder.py: 80 % of the dense peak. A square product of one size reaches less."),
    F(key="t4-fp16-tensor-peak", value=65, unit="TFLOPS", quantity="FP16 Tensor Core peak (as announced)",
      hardware="NVIDIA Tesla T4", software="not stated (an announced figure)",
      url="https://pc.watch.impress.co.jp/docs/news/1142896.html",
      title="PC Watch: NVIDIA、AI学習モデルの推論処理に特化した「Tesla T4」 (report of NVIDIA's GTC Japan 2018 "
            "announcement)",
      where="caption of the announcement slide on the Tensor Cores' precisions; a secondary source (a press report), "
            "the same figure the course's datasheet table uses",
      quote="FP16での演算性能は65TFLOPSで、INT8で秒間130兆回オペレーション、INT4で秒間260兆オペレーション",
      chapters=(1,),
      note="Secondary source: a press report of NVIDIA's announcement, not the datasheet (no NVIDIA primary source "
           "was found in the searchable corpora); the course's datasheet table uses 65 (a T4's predicted rate is a "
           "measured share of it), so it checks that figure. "
           "The T4 has no bf16 tensor cores (compute capability 7.5)."),
)

KERNELS = (
    # kernels: bandwidth reached, occupancy, Triton and CUDA kernel benchmarks
    F(key="triton-fused-softmax-expected-speedup", value=4, unit="x",
      quantity="expected speed-up of a fused softmax over the unfused PyTorch one, from the bytes each moves",
      hardware="any GPU (a count of DRAM traffic, not a measurement)",
      software="Triton tutorial 02, main branch",
      url="https://github.com/triton-lang/triton/blob/main/python/tutorials/02-fused-softmax.py",
      title="Triton tutorials: Fused Softmax", where="section Motivations",
      quote="we could expect a theoretical speed-up of ~4x (i.e., :math:`(8MN + 4M) / 2MN`)",
      chapters=(2,),
      note="The same count as chapter 2's: the unfused version reads 5MN and writes 3MN elements, the fused one "
           "reads and writes MN each."),
    F(key="triton-fused-softmax-vs-torch-jit", value=4, unit="x",
      quantity="speed of the fused Triton softmax over the unfused Torch JIT one, as a comment under a plot, 4096 rows, "
               "float32",
      hardware="the tutorial's NVIDIA GPU (not named in the source)",
      software="Triton tutorial 02, main branch (triton.testing.do_bench)",
      url="https://github.com/triton-lang/triton/blob/main/python/tutorials/02-fused-softmax.py",
      title="Triton tutorials: Fused Softmax", where="section Benchmark, the comments under the plot",
      quote="Triton is 4x faster than the Torch JIT. This confirms our suspicions that the Torch JIT does not do any "
            "fusion here.",
      chapters=(2,),
      note="A prose comment under the tutorial's benchmark plot, not a table entry: an approximate reading of the "
           "plot, on a GPU the source does not name, against naive_softmax compiled with torch.jit.script (\"Torch "
           "JIT\"). Later versions of the tutorial dropped torch.jit.script from naive_softmax, so the comment may be "
           "stale. It agrees with the bytes model (4x less traffic)."),
    F(key="sm75-max-warps-per-sm", value=32, unit="warps",
      quantity="maximum resident (concurrent) warps per SM",
      hardware="NVIDIA Turing, compute capability 7.5 (the T4)", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/turing-tuning-guide/index.html",
      title="Tuning CUDA Applications for Turing (NVIDIA Turing Tuning Guide)", where="section 1.4.1.3 Occupancy",
      quote='The maximum number of concurrent warps per SM is 32 on Turing (versus 64 on Volta).',
      chapters=(2,),
      note='gpuformer_lib.occupancy uses it for the T4; a test checks the two agree.'),
    F(key="sm75-max-blocks-per-sm", value=16, unit="blocks",
      quantity="maximum resident thread blocks per SM",
      hardware="NVIDIA Turing, compute capability 7.5 (the T4)", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/turing-tuning-guide/index.html",
      title="Tuning CUDA Applications for Turing (NVIDIA Turing Tuning Guide)", where="section 1.4.1.3 Occupancy",
      quote='The maximum number of thread blocks per SM is 16.',
      chapters=(2,)),
    F(key="sm75-shared-memory-per-sm", value=64, unit="KB",
      quantity="shared memory capacity per SM",
      hardware="NVIDIA Turing, compute capability 7.5 (the T4)", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/turing-tuning-guide/index.html",
      title="Tuning CUDA Applications for Turing (NVIDIA Turing Tuning Guide)", where="section 1.4.1.3 Occupancy",
      quote='Shared memory capacity per SM is 64KB.',
      chapters=(2,)),
    F(key="sm90-max-warps-per-sm", value=64, unit="warps",
      quantity="maximum resident (concurrent) warps per SM",
      hardware="NVIDIA Hopper, compute capability 9.0 (H100)", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/hopper-tuning-guide/index.html",
      title="Tuning CUDA Applications for Hopper GPU Architecture (NVIDIA Hopper Tuning Guide)", where="section 1.4.1.1 Occupancy",
      quote='The maximum number of concurrent warps per SM remains the same as in NVIDIA Ampere GPU architecture (that is, 64)',
      chapters=(2,),
      note='gpuformer_lib.occupancy uses it for the H100; a test checks the two agree.'),
    F(key="sm90-max-blocks-per-sm", value=32, unit="blocks",
      quantity="maximum resident thread blocks per SM",
      hardware="NVIDIA Hopper, compute capability 9.0 (H100)", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/hopper-tuning-guide/index.html",
      title="Tuning CUDA Applications for Hopper GPU Architecture (NVIDIA Hopper Tuning Guide)", where="section 1.4.1.1 Occupancy",
      quote='The maximum number of thread blocks per SM is 32 for devices of compute capability 9.0 (that is, H100 GPUs).',
      chapters=(2,)),
    F(key="sm90-shared-memory-per-sm", value=228, unit="KB",
      quantity="shared memory capacity per SM (227 KB at most per block)",
      hardware="NVIDIA Hopper, compute capability 9.0 (H100)", software="CUDA documentation (version not stated on the page)",
      url="https://docs.nvidia.com/cuda/hopper-tuning-guide/index.html",
      title="Tuning CUDA Applications for Hopper GPU Architecture (NVIDIA Hopper Tuning Guide)", where="section 1.4.1.1 Occupancy",
      quote="For devices of compute capability 9.0 (H100 GPUs), shared memory capacity per SM is 228 KB, a 39% increase compared to A100’s capacity of 164 KB.",
      chapters=(2,)),
)

ATTENTION = (
    # fused attention, FlashAttention, the memory of explicit attention
    F(key="flashattention-memory-saving-2k", value=10, unit="x",
      quantity="memory saving of FlashAttention against PyTorch standard attention at sequence length 2K",
      hardware="NVIDIA A100 (the README's A100 section)", software="not stated",
      url="https://github.com/Dao-AILab/flash-attention", title="FlashAttention (Dao-AILab/flash-attention README)",
      where="README, Performance > A100 > Memory",
      quote="We see 10X memory savings at sequence length 2K, and 20X at 4K.", chapters=(3,),
      note="Forward + backward; the saving grows with T because standard attention's memory is quadratic "
           "and FlashAttention's linear in the sequence length."),
    F(key="flashattention-memory-saving-4k", value=20, unit="x",
      quantity="memory saving of FlashAttention against PyTorch standard attention at sequence length 4K",
      hardware="NVIDIA A100 (the README's A100 section)", software="not stated",
      url="https://github.com/Dao-AILab/flash-attention", title="FlashAttention (Dao-AILab/flash-attention README)",
      where="README, Performance > A100 > Memory",
      quote="We see 10X memory savings at sequence length 2K, and 20X at 4K.", chapters=(3,),
      note="Twice the saving at twice the length: the ratio of a T^2 term to a T term."),
    F(key="flashattention-1-fraction-of-peak", value=40, unit="%",
      quantity="FlashAttention (v1): fraction of the theoretical maximum FLOPs/s reached (upper end of 25-40 %)",
      hardware="not named in the quoted sentence", software="not stated",
      url="https://arxiv.org/abs/2307.08691",
      title="Dao (2023), FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
      where="abstract",
      quote="FlashAttention is still not nearly as fast as optimized matrix-multiply (GEMM) operations, reaching "
            "only 25-40% of the theoretical maximum FLOPs/s.", chapters=(3,),
      note="A fused attention kernel reaches a smaller share of the peak than a large matrix product does."),
    F(key="turing-flash-forward-vs-sdpa-t4", value=2, unit="x",
      quantity="a FlashAttention forward written for Turing against F.scaled_dot_product_attention (which runs "
               "the memory-efficient kernel there)",
      hardware="NVIDIA T4", software="not stated",
      url="https://github.com/Dao-AILab/flash-attention/issues/1533",
      title="FlashAttention forward support for Turing (Dao-AILab/flash-attention issue #1533)",
      where="issue description (batch 4, 32 heads, head_dim 128, no masking)",
      quote="our implementation is currently around 2x faster than Pytorch's F.scaled_dot_product_attention, "
            "which calls Memory-Efficient Attention in the backend. This was tested for T4.", chapters=(3,),
      note="Also the source for which backend PyTorch uses on a T4 (sm_75): the memory-efficient kernel, "
           "not FlashAttention, whose CUDA kernels need sm_80 or newer."),
)

HEADS = (
    # multi-head, MQA/GQA, the KV cache, decoding speed
    F(key="gpt-fast-llama2-7b-decode-tokens-per-s", value=104.9, unit="tokens/s",
      quantity="decode speed of Llama-2-7B in bf16 at batch size 1 (gpt-fast, torch.compile, KV cache)",
      hardware="NVIDIA A100-80GB (one of 8, power-limited to 330 W)", software="PyTorch nightly (late 2023), gpt-fast",
      url="https://github.com/pytorch-labs/gpt-fast", title="gpt-fast (README)", where="Benchmarks table, row Base",
      quote="| Llama-2-7B  | Base    |  104.9  | 1397.31 |", chapters=(4, 10, 16),
      note="Batch size 1 and a 5-token prompt: each token reads every weight once, so the rate is bandwidth-bound."),
    F(key="gpt-fast-llama2-7b-decode-bandwidth", value=1397.31, unit="GB/s",
      quantity="memory bandwidth reached while decoding Llama-2-7B in bf16 at batch size 1",
      hardware="NVIDIA A100-80GB (one of 8, power-limited to 330 W)", software="PyTorch nightly (late 2023), gpt-fast",
      url="https://github.com/pytorch-labs/gpt-fast", title="gpt-fast (README)",
      where="Benchmarks table, row Base, column Memory Bandwidth (GB/s)",
      quote="| Llama-2-7B  | Base    |  104.9  | 1397.31 |", chapters=(2, 4),
      note="The README adds: \"Empirically, seems like peak bandwidth is about 1700 GB/s\" on this power-limited "
           "A100 (gpt-fast-a100-330w-peak-bandwidth); the datasheet figure is 2039 GB/s."),
    F(key="gpt-fast-a100-330w-peak-bandwidth", value=1700, unit="GB/s",
      quantity="peak memory bandwidth the gpt-fast authors observed on their power-limited A100 (an estimate)",
      hardware="NVIDIA A100-80GB, power-limited to 330 W", software="PyTorch nightly (late 2023), gpt-fast",
      url="https://github.com/pytorch-labs/gpt-fast", title="gpt-fast (README)",
      where="the note under the speculative-sampling section",
      quote=("Note: Running on an A100 80GB, albeit power-limited to 330 watts. Empirically, seems like peak "
             "bandwidth is about 1700 GB/s."),
      chapters=(2,),
      note="An estimate (\"about\", \"seems like\"), not a measurement the README details: the ceiling the "
           "decode bandwidth (gpt-fast-llama2-7b-decode-bandwidth) is fairly compared with on that card, where "
           "the datasheet's 2039 GB/s (a100-80gb-hbm-bandwidth) is for a card at full power."),
    F(key="flash-attention-2-max-head-dim", value=256, unit="head dim",
      quantity="largest head dimension FlashAttention-2 supports",
      hardware="Ampere, Ada or Hopper GPUs (A100, RTX 3090, RTX 4090, H100); not Turing (T4)",
      software="flash-attn 2.x (head dim 256 backward on consumer GPUs from 2.5.5)",
      url="https://github.com/Dao-AILab/flash-attention", title="FlashAttention (README)",
      where="Installation and features, NVIDIA CUDA Support, item 3",
      quote="All head dimensions up to 256.", chapters=(4,),
      note="A limit of the kernel, not a measurement: larger heads fall back to another SDPA backend."),
)

MODEL = (
    # layers and model step times, positional encodings, tensor-core-friendly shapes
    F(key="transformer-base-step-time-8xp100", value=0.4, unit="s",
      quantity="training step time, Transformer base (batches of about 25,000 source + 25,000 target tokens)",
      hardware="one machine with 8 NVIDIA P100 GPUs", software="not stated (Tensor2Tensor, TensorFlow, 2017)",
      url="https://arxiv.org/abs/1706.03762", title="Attention Is All You Need (Vaswani et al., 2017)",
      where="§5.2 Hardware and Schedule",
      quote=("For our base models using the hyperparameters described throughout the paper, each training step "
             "took about 0.4 seconds."),
      chapters=(5, 10, 13),
      note=("A step of the 65 M-parameter base model over 8 GPUs, each with about 1/8 of the batch. Read in the "
            "paper's text as reproduced verbatim in public copies (§5.2).")),
    F(key="transformer-base-training-hours-8xp100", value=12, unit="hours",
      quantity="training time of the Transformer base model, 100,000 steps",
      hardware="one machine with 8 NVIDIA P100 GPUs", software="not stated (Tensor2Tensor, TensorFlow, 2017)",
      url="https://arxiv.org/abs/1706.03762", title="Attention Is All You Need (Vaswani et al., 2017)",
      where="§5.2 Hardware and Schedule",
      quote="We trained the base models for a total of 100,000 steps or 12 hours.",
      chapters=(5, 13), note="100,000 steps x 0.4 s = 11.1 hours: the two figures agree."),
    F(key="nanogpt-padded-vocab-size", value=50304, unit="tokens",
      quantity="GPT-2 vocabulary padded to a multiple of 64",
      hardware="not hardware-specific (a shape choice for GPU matrix products)", software="nanoGPT (PyTorch)",
      url="https://github.com/karpathy/nanoGPT/blob/master/model.py", title="nanoGPT, model.py (Karpathy)",
      where="GPTConfig, vocab_size",
      quote="vocab_size: int = 50304 # GPT-2 vocab_size of 50257, padded up to nearest multiple of 64 for efficiency",
      chapters=(5,),
      note="50304 = 64 x 786 = 2^7 x 393; the 47 extra rows are never a target, so training learns to ignore them."),
)

_ZERO_PAPER = dict(
    hardware="any GPU (a count of bytes, not a measurement)", software="not stated",
    url="https://arxiv.org/abs/1910.02054",
    title="Rajbhandari, Rasley, Ruwase and He (2020), ZeRO: Memory Optimizations Toward Training Trillion "
          "Parameter Models (SC20; arXiv:1910.02054)",
    where="section 3.1, Model States: Optimizer States, Gradients and Parameters", chapters=(6,))

OPTIMIZERS = (
    # optimizer memory and step time, losses, clipping
    F(key="zero-mixed-precision-adam-bytes-per-param", value=16, unit="bytes per parameter",
      quantity="model states of mixed-precision Adam (fp16 weights and gradients, fp32 master copy and moments)",
      quote="Mixed-precision Adam has K = 12. In total, this results in 2\u03a8 + 2\u03a8 + K\u03a8 = 16\u03a8 "
            "bytes of memory requirement.",
      note="Read in a verbatim reproduction of the paper's section 3.1 (the arXiv PDF itself was not in the "
           "sources available). Float32 AdamW also comes to 16 B per parameter: 4 weights + 4 gradients + 8 "
           "moments; mixed precision does not shrink the model states, it speeds up the arithmetic.",
      **_ZERO_PAPER),
    F(key="zero-gpt2-1.5b-adam-model-states", value=24, unit="GB",
      quantity="model states of mixed-precision Adam for GPT-2 with 1.5 billion parameters",
      quote="For a model such as GPT-2 with 1.5 Billion parameters, this leads to a memory requirement of at "
            "least 24 GB, which is significantly higher than the meager 3 GB of memory required to hold the "
            "f p16 parameters alone.",
      note="16 B x 1.5e9 parameters, before any activation: more than a 16 GB T4 holds, from the optimizer's "
           "bookkeeping alone.", **_ZERO_PAPER),
    F(key="liger-fused-linear-cross-entropy-memory", value=4, unit="x (at least) peak-memory reduction",
      quantity="peak memory of fused linear + cross-entropy (chunked) against the Hugging Face layers, 128k vocabulary",
      hardware="NVIDIA A100 80G (one GPU)", software="Liger Kernel (Triton); torch >= 2.1.2, triton >= 2.3.0",
      url="https://github.com/linkedin/Liger-Kernel",
      title="Liger Kernel: Efficient Triton Kernels for LLM Training (README)",
      where="README, Kernels section, FusedLinearCrossEntropy; conditions in the note below the list",
      quote="It achieves >4X memory reduction for 128k vocab size.",
      note="The README's note: 'All models use 4K hidden size and 4K sequence length and are evaluated based on "
           "memory usage and wall time for the forward+backward pass on a single NVIDIA A100 80G GPU'. The "
           "saving comes from never holding the whole (B*T, V) logits and their gradient: chunks of rows are "
           "projected, their loss and gradient computed, and the chunk freed.",
      chapters=(6,)),
)

# chapters 7-12: one tuple per chapter
TRAINING: tuple[F, ...] = (  # chapter 7: the training loop, input pipeline, checkpoints
    F(key="transformer-base-batch-tokens", value=25000, unit="tokens",
      quantity="tokens per training batch (a token budget, per side: source and target)",
      hardware="not hardware: a batching choice (the paper's §5.2, not this quote, puts the runs on 8 NVIDIA P100s)",
      software="not stated (Tensor2Tensor, TensorFlow, 2017)",
      url="https://arxiv.org/abs/1706.03762", title="Attention Is All You Need (Vaswani et al., 2017)",
      where="§5.1 Training Data and Batching",
      quote=("Sentence pairs were batched together by approximate sequence length. Each training batch contained a "
             "set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."),
      chapters=(7, 13),
      note=("Batches sized by tokens, not sentences, and bucketed by length: the token-budget batching of this "
            "chapter. Read in the paper's LaTeX source (training.tex) as reproduced verbatim in public copies.")),
    F(key="packing-padding-share-common-datasets", value=50, unit="%",
      quantity="share of all tokens that are padding when common NLP data sets are padded to a fixed length",
      hardware="not hardware: a property of the data sets (BERT's Wikipedia pre-training data, GLUE, SQuAD)",
      software="the paper's own analysis of sequence-length histograms",
      url="https://arxiv.org/abs/2107.02027",
      title=("Krell, Kosec, Perez and Fitzgibbon 2021, Efficient Sequence Packing without Cross-contamination: "
             "Accelerating Large Language Models without Impacting Performance"),
      where="abstract",
      quote=("We show in this paper that the variation in sequence lengths in common NLP datasets is such that up "
             "to 50% of all tokens can be padding."),
      chapters=(7,),
      note="The abstract adds that for GLUE-cola at sequence length 128 the ratio is up to 89%."),
    F(key="packing-bert-phase2-speedup", value=2, unit="x",
      quantity="training speed-up from packing (BERT pre-training, phase 2)",
      hardware="not stated in the quote (the authors' experiments ran on Graphcore IPUs, not GPUs)", software="the authors' packed BERT (NNLSHP / SPFHP packing)",
      url="https://arxiv.org/abs/2107.02027",
      title=("Krell, Kosec, Perez and Fitzgibbon 2021, Efficient Sequence Packing without Cross-contamination: "
             "Accelerating Large Language Models without Impacting Performance"),
      where="abstract",
      quote=("This paper introduces a new formalization of sequence packing in the context of the well-studied bin "
             "packing problem, and presents new algorithms based on this formulation which, for example, confer a "
             "2x speedup for phase 2 pre-training in BERT."),
      chapters=(7,),
      note=("Measured by Graphcore on its IPUs, where the step is compute-bound: removing about half the tokens "
            "(all padding) doubles the sequences per second. On a GPU the same holds only for compute-bound "
            "steps; a launch-bound step (small batches of short sentences) gains little.")),
)

_TORCHAO_FLOAT8 = dict(
    url="https://github.com/pytorch/ao/blob/0cf1281a38bdd8c84b11549ffc49a63eb3a92d40/torchao/float8/README.md",
    title="torchao.float8 README (pytorch/ao)", software="torchao.float8 with torch.compile", chapters=(8,))

PRECISION: tuple[F, ...] = (  # chapter 8: mixed precision, FP8
    F(key="h100-sxm-fp8-dense-peak", value=1979, unit="TFLOPS", quantity="dense FP8 Tensor Core peak (no sparsity)",
      hardware="NVIDIA H100 SXM", software="not stated (a datasheet figure)",
      url="https://github.com/stas00/ml-engineering/blob/b9e29720eebd4aa946fa9678975385efbc90a777/compute/accelerator/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Accelerators",
      where="TFLOPS comparison table (theoretical peak, w/o sparsity; columns fp32, tf32, fp16, bf16, fp8, int8), "
            "fp8 column; a secondary source restating NVIDIA's datasheet",
      quote="| NVIDIA H100 SXM       |  67.0 |  494.5 |  989 |  989 | 1979 | 1979 |", chapters=(8, 16),
      note="Twice the bf16 peak (989): the most an FP8 matrix product can gain over bf16 on this GPU. The input "
           "of the course's FP8 prediction (fp8.FP8_DENSE_PEAK_TFLOPS); a T4 has no FP8 tensor cores."),
    F(key="transformer-v100-amp-training-speedup", value=3.12, unit="x",
      quantity="training throughput, fp16 mixed precision with an fp32 master copy (Apex's FP16_Optimizer, not "
               "autocast) over float32, Transformer on WMT14 en-de",
      hardware="1 NVIDIA V100 16GB (DGX-1)", software="PyTorch NGC container (fairseq-based scripts)",
      url="https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Translation/Transformer/README.md",
      title="NVIDIA DeepLearningExamples: Transformer for PyTorch (README)",
      where="Results, Training performance results, NVIDIA DGX-1 (8x V100 16G) table: GPUs 1, batch 2560 tokens "
            "per GPU (tokens/s FP32, mixed precision, speedup)",
      quote="|1       |2560                | 7635                 | 23821                           | 3.12",
      chapters=(8, 13),
      note="Same batch in both modes; the V100's datasheet fp16 tensor-core peak is 8x its fp32 peak (125 / 15.7 "
           "TFLOP/s), so the whole step gains less than its matrix products could: the element-wise work, the "
           "optimizer and data loading do not speed up 8x. The recipe is not autocast (AMP): the README's --fp16 "
           "runs 'Apex's FP16_Optimizer API': the model's weights, forward and backward in FP16 (the loss in FP32), "
           "an FP32 copy of the weights for the update, copied back to FP16 after it, and dynamic loss scaling "
           "from 2^7: chapter 8's 'fp16 + fp32 master' recipe (mixed_precision.RECIPES)."),
    F(key="torchao-float8-linear-speedup-large", value=1.39, unit="x",
      quantity="float8 linear over bf16, microbenchmark-based speedup estimate, large shapes M, K, N = 4096, 8192, 16384",
      hardware="NVIDIA H100", where="Performance, Example 2 (large shapes): microbenchmark-based speedup estimate",
      quote="benchmark speedup is 1.39",
      note="The README's derivation counts the max_abs and casting overhead of float8 against the faster gemm, which "
           "is why it is below the 2x of the FP8/bf16 peak ratio.", **_TORCHAO_FLOAT8),
    F(key="torchao-float8-linear-speedup-small", value=0.8, unit="x",
      quantity="float8 linear over bf16, microbenchmark-based speedup estimate, small shapes M, K, N = 1024, 2048, 1024",
      hardware="NVIDIA H100", where="Performance, Example 1 (small shapes): microbenchmark-based speedup estimate",
      quote="benchmark speedup is 0.80",
      note="Slower than bf16: 'leave this linear in bfloat16, the shapes are too small to benefit from float8 "
           "compute' (the README's recommendation).", **_TORCHAO_FLOAT8),
    F(key="torchao-float8-llama3-70b-speedup", value=1.5, unit="x (up to)",
      quantity="training throughput speedup with float8 (torch.compile on), LLaMa 3 70B pretraining",
      hardware="128 GPUs (the sentence does not name the GPU type)",
      where="introduction (first paragraph)",
      quote="initial results show throughput speedups of up to 1.5x on 128 GPU LLaMa 3 70B pretraining jobs",
      note="A whole training job at scale; an upper figure ('up to'), 'initial results'. The sentence names neither "
           "the GPU nor the baseline; the README's microbenchmarks compare float8 with bfloat16 on an H100.",
      **{**_TORCHAO_FLOAT8, "chapters": (8, 16)}),
)

MEMORY: tuple[F, ...] = (  # chapter 9: memory, accumulation, checkpointing
    F(key="nemo-expandable-segments-realloc-overhead", value=30, unit="% of training time (about)",
      quantity="overhead of the CUDA caching allocator re-allocating memory every mini-batch (dynamic batch shapes, "
               "near the GPU's memory limit), removed by expandable_segments",
      hardware="an NVIDIA GPU (not named in the pull request)", software="NVIDIA NeMo ASR training, PyTorch",
      url="https://github.com/NVIDIA/NeMo/pull/9061",
      title="NVIDIA NeMo pull request #9061: PyTorch CUDA allocator optimization for dynamic batch shape "
            "dataloading in ASR",
      where="pull request description (merged May 2, 2024)",
      quote=("The profile revealed it was re-allocating memory for every mini-batch, generating about 30% overhead "
             "in training."),
      chapters=(9,),
      note=("The PR's fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, 'which instead of reallocating, extends "
            "existing allocations as needed'. One profiled run, not a benchmark: the size of the effect depends on "
            "how much the shapes vary and how close the run is to the memory limit.")),
    F(key="korthikanti-selective-recompute-activation-memory", value=5, unit="x less activation memory",
      quantity="activation memory saved by sequence parallelism + selective activation recomputation (the "
               "abstract's 'our method'; the baseline is in the paper's body, not in the quote)",
      hardware="NVIDIA A100 GPUs (the abstract's other sentences: up to 2240 GPUs, models up to one trillion "
               "parameters)", software="Megatron-LM",
      url="https://mlsys.org/virtual/2023/poster/2445",
      title="Korthikanti et al. (MLSys 2023; arXiv:2205.05198), Reducing Activation Recomputation in Large "
            "Transformer Models",
      where="abstract (the MLSys 2023 poster page)",
      quote=("our method reduces activation memory by 5x, while reducing execution time overhead from activation "
             "recomputation by over 90%"),
      chapters=(9,),
      note=("Selective recomputation keeps the linear s b h terms of the per-layer count s b h (34 + 5 a s / h) "
            "bytes (the paper's form as restated by secondary write-ups, e.g. AWS Neuron's 'Activation Memory "
            "Reduction' guide; the paper's body was not opened), and recomputes the attention core's 5 a s^2 b; the 5x combines it with sequence "
            "parallelism over the tensor-parallel GPUs. Chapter 9's SelectiveCheckpoint is the single-GPU part.")),
)

PROFILING: tuple[F, ...] = (  # chapter 10: monitoring, profiling, MFU
    F(key="palm-540b-mfu", value=46.2, unit="%", quantity="MFU of training (model FLOPs per second / peak)",
      hardware="6144 TPU v4 chips (several pods)", software="JAX + T5X on Pathways (XLA)",
      url="https://arxiv.org/abs/2204.02311",
      title="Chowdhery et al. 2022, PaLM: Scaling Language Modeling with Pathways",
      where="section 'Training Efficiency' (Table 3, model FLOPs utilization)",
      quote="The MFU of PaLM 540B is 45.7% without self-attention or 46.2% with it.", chapters=(10,),
      note="The hardware is the abstract's: 'We trained PaLM on 6144 TPU v4 chips using Pathways, a new ML system "
           "which enables highly efficient training across multiple TPU Pods.' "
           "Not a GPU: a TPU v4 run, quoted because the paper defines MFU (and HFU, 57.8 % with "
           "rematerialisation) as this chapter does, with the attention FLOPs counted."),
    F(key="megatron-530b-a100-mfu", value=54.2, unit="%", quantity="MFU of training (model FLOPs per second / peak)",
      hardware="2240 NVIDIA A100 GPUs", software="Megatron-LM (tensor + pipeline + sequence parallel)",
      url="https://arxiv.org/abs/2205.05198",
      title="Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models",
      where="abstract (and Table 5, end-to-end iteration time, MFU and HFU per model size)",
      quote="when training a 530B parameter GPT-3 style model [20] on 2240 NVIDIA A100 GPUs, we achieve a Model "
            "Flops Utilization of 54.2%, which is 29% faster than the 42.1% we achieve using recomputation",
      chapters=(10,),
      note="Table 5 of the same paper gives 56.3 % MFU and 57.0 % HFU for a 1T model without data parallelism. "
           "Its FLOPs formula (appendix A) is the course's transformer_flops: 72BLsh^2(1 + s/6h + v/12hL)."),
    F(key="llm-c-gpt2-124m-a100-mfu", value=60, unit="%",
      quantity="MFU llm.c reaches ('up to ~60%': an upper figure, not a measured run's average)",
      hardware="one 8x A100 80GB SXM node", software="llm.c (C/CUDA), GPT-2 124M, T = 1024, 10B FineWeb tokens",
      url="https://www.luisquintanilla.me/feed/repro-gpt-2-llm-c-90-min-20-dollars-karpathy",
      title="Karpathy 2024, Reproducing GPT-2 (124M) in llm.c in 90 minutes for $20 (llm.c discussion #481), as "
            "quoted in Luis Quintanilla's reshare of it",
      where="the reshare's block quote of the discussion's TLDR; a secondary source quoting the primary verbatim",
      quote="With llm.c, which is quite efficient at up to ~60% model flops utilization, reproducing this model on "
            "one 8X A100 80GB SXM node takes ~90 minutes.",
      chapters=(10,),
      note="Secondary source: the primary, https://github.com/karpathy/llm.c/discussions/481 (Karpathy's opening "
           "post), was not in the searchable corpora and was not opened; the reshare quotes it verbatim and links "
           "to it (llm.c's README points to the same discussion for this reproduction). 'up to ~60%': a rounded "
           "upper figure from the author, not a table or a whole run's average. The same model as this chapter's "
           "GPU preset (GPT-2 small, T = 1024) on the previous generation of data-centre GPU."),
)

_NCCL_TUNING = dict(
    hardware="the link kinds NCCL's tuning model distinguishes (NVLink, PCI, network)",
    software="NCCL source, src/graph/tuning.cc at commit b6475625 (copyright 2016-2022; has Hopper and NVLS entries)",
    url="https://github.com/NVIDIA/nccl/blob/b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2/src/graph/tuning.cc",
    title="NCCL, src/graph/tuning.cc: the latency and bandwidth model NCCL picks its algorithm with",
    chapters=(11,))

DATA_PARALLEL: tuple[F, ...] = (  # chapter 11: data parallel, collectives, NCCL bandwidth
    F(key="nccl-h100-nvls-allreduce-busbw", value=480, unit="GB/s",
      quantity="all-reduce bus bandwidth, 8 GPUs in one node (NVLink SHARP, large messages)",
      hardware="8x NVIDIA H100 in one NVSwitch node (NVLink 4)", software="NCCL with NVLS (version not stated)",
      url="https://github.com/NVIDIA/nccl-tests/issues/212", title="NVIDIA/nccl-tests issue #212, 'H100 all reduce "
      "performance is poor' (answer by NCCL developer sjeaugey)", where="comment of 2024-05-06",
      quote="On 8 GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s).", chapters=(11,),
      note="With NVLink SHARP the switch does the sums, so this busbw does not count bytes on a wire (it exceeds "
           "NVLink 4's 450 GB/s per direction); the same answer gives 370 GB/s as NCCL's effective NVLink rate "
           "for the ring, the figure the course's ring model uses."),
    F(key="nccl-h100-nvlink-effective-ring", value=370, unit="GB/s",
      quantity="effective NVLink bandwidth NCCL reaches (ring, protocol overhead included)",
      hardware="8x NVIDIA H100 in one node (NVLink 4, 450 GB/s line rate per direction)",
      software="NCCL (version not stated)",
      url="https://github.com/NVIDIA/nccl-tests/issues/212", title="NVIDIA/nccl-tests issue #212, 'H100 all reduce "
      "performance is poor' (answer by NCCL developer sjeaugey)", where="comment of 2024-05-06",
      quote="450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth "
            "of 370GB/s, which you can observe as \"BusBw\" when running non-allreduce operations, or when running "
            "with `NCCL_ALGO=RING`.", chapters=(11,),
      note="The intra-node bus bandwidth of the course's ring predictions for an H100 node."),
    F(key="nccl-ndr400-nic-busbw", value=48, unit="GB/s", quantity="bus bandwidth one 400 Gb/s NIC sustains",
      hardware="NVIDIA ConnectX-7 NIC at 400 Gb/s, HGX nodes", software="NCCL (version not stated)",
      url="https://github.com/NVIDIA/nccl-tests/issues/319", title="NVIDIA/nccl-tests issue #319, 'nccl-test "
      "performance with doca on 2 or 4 HGX hosts is not good' (answer by NCCL developer AddyLaddy)",
      where="comment of 2025-06-11",
      quote="You should achieve around 48GB/s from each CX7 NIC at 400Gbps.", chapters=(11,),
      note="400 Gb/s is 50 GB/s; a node with one such NIC between nodes gives every GPU's ring about 48 GB/s."),
    F(key="nccl-2node-8nic-ring-busbw", value=396, unit="GB/s",
      quantity="all-reduce bus bandwidth across nodes with 8 x 400 Gb/s NICs per node (ring)",
      hardware="HGX nodes (NVLink inside), 8 ConnectX-7 NICs at 400 Gb/s each", software="NCCL, NCCL_ALGO=RING",
      url="https://github.com/NVIDIA/nccl-tests/issues/319", title="NVIDIA/nccl-tests issue #319, 'nccl-test "
      "performance with doca on 2 or 4 HGX hosts is not good' (answer by NCCL developer AddyLaddy)",
      where="comment of 2025-06-11",
      quote="Then with NVLink based nodes that can be aggregated to achieve up to ~396GB/s with the RING protocol.",
      chapters=(11,),
      note="The issue's description gives the nodes: 'Supermicro HGX SYS-821GE-TNHR with 8xH100 and 8x CX-7 IB "
           "400Gbps', so 396 is eight NICs aggregated. The inter-node bus bandwidth of a rail-optimised H100 cluster "
           "(one NIC per GPU): close to NVLink's 370, so such a cluster loses little bandwidth between 8 and 64 GPUs."),
    F(key="nccl-100g-nic-busbw", value=12.2, unit="GB/s", quantity="bus bandwidth one 100 Gb/s NIC sustains",
      hardware="one 100 Gb/s InfiniBand EDR adapter per node", software="NCCL (2019)",
      url="https://github.com/NVIDIA/nccl-tests/issues/29", title="NVIDIA/nccl-tests issue #29, 'Performance issues "
      "of NCCL Allreduce' (answer by NCCL developer sjeaugey)", where="comment of 2019-12-06",
      quote="OK so performance is good now. 12.2 GB/s (for a 100Gbps card) is as good as you can get.",
      chapters=(11,),
      note="A cluster with one 100 Gb/s NIC per node: the inter-node level 30x slower than an H100's NVLink ring."),
    F(key="nccl-nvlink-ring-step-latency", value=3.4, unit="µs",
      quantity="latency NCCL's model charges per ring step over NVLink (Simple protocol)", where="hwLat table, NVLINK "
      "row, Ring (LL/LL128/Simple)", quote="/* Ring (LL/LL128/Simple)*/ { .6, 1.9, 3.4 },",
      note="Per step of the ring (an all-reduce on N GPUs takes 2 (N - 1)); the LL protocol NCCL uses for small "
           "messages charges 0.6. Compare gloo's alpha measured on this page.", **_NCCL_TUNING),
    F(key="nccl-nvlink-ring-ll-step-latency", value=0.6, unit="µs",
      quantity="latency NCCL's model charges per ring step over NVLink (LL protocol)", where="hwLat table, NVLINK "
      "row, Ring (LL/LL128/Simple)", quote="/* Ring (LL/LL128/Simple)*/ { .6, 1.9, 3.4 },",
      note="LL (low latency) sends 8 bytes of data with 8 bytes of flags, so it is fast to start and slow to "
           "stream; NCCL picks it for small messages. The course's predictor prices each protocol and takes the "
           "fastest, as NCCL does.", **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-nvlink-ring-ll128-step-latency", value=1.9, unit="µs",
      quantity="latency NCCL's model charges per ring step over NVLink (LL128 protocol)", where="hwLat table, NVLINK "
      "row, Ring (LL/LL128/Simple)", quote="/* Ring (LL/LL128/Simple)*/ { .6, 1.9, 3.4 },",
      note="LL128 carries 120 bytes of data in every 128, between LL and Simple in latency and bandwidth.",
      **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-ring-ll-base-latency", value=6.6, unit="µs",
      quantity="base latency NCCL's model charges per ring all-reduce call (LL protocol)",
      where="baseLat table, Ring row (LL, LL128, Simple)",
      quote="{  6.8, 14.0,    0 }, {  6.6, 14.0,  8.4 },  // Tree, Ring",
      note="Paid once per call, whatever the message size: a tensor-parallel layer's two small all-reduces pay it "
           "twice per layer.", **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-ring-ll128-base-latency", value=14.0, unit="µs",
      quantity="base latency NCCL's model charges per ring all-reduce call (LL128 protocol)",
      where="baseLat table, Ring row (LL, LL128, Simple)",
      quote="{  6.8, 14.0,    0 }, {  6.6, 14.0,  8.4 },  // Tree, Ring", **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-ring-simple-base-latency", value=8.4, unit="µs",
      quantity="base latency NCCL's model charges per ring all-reduce call (Simple protocol)",
      where="baseLat table, Ring row (LL, LL128, Simple)",
      quote="{  6.8, 14.0,    0 }, {  6.6, 14.0,  8.4 },  // Tree, Ring",
      note="With nccl-nvlink-ring-step-latency, a ring all-reduce on 8 GPUs over NVLink costs at least "
           "8.4 + 14 x 3.4 = 56 µs in Simple, before a byte of bandwidth.", **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-ll-allreduce-bandwidth-divisor", value=4.0, unit="(divides the link's bus bandwidth)",
      quantity="what NCCL's model divides a ring all-reduce's bus bandwidth by for the LL protocol",
      where="ncclTopoTuneModel, 'Various model refinements' (ring, LL)",
      quote="busBw * ((nNodes > 1 || coll == ncclFuncAllReduce || coll == ncclFuncReduce) ? 1.0/4.0 : 1.0/3.0)",
      note="Also capped by a per-GPU-generation maximum (llMaxBws) that the course's model leaves out; LL is only "
           "chosen for messages too small for bandwidth to matter.", **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-ll128-bandwidth-share", value=0.92, unit="(share of the Simple protocol's bus bandwidth)",
      quantity="bus bandwidth of the LL128 protocol for a ring, as a share of the link's (2+ GPUs a node)",
      where="ncclTopoTuneModel, 'Various model refinements' (ring, LL128)",
      quote="busBw * (ppn < 2 ? 0.7 : 0.92 /*120.0/128.0*/)",
      note="Also capped per channel (perChMaxRingLL128Bws), which the course's model leaves out.",
      **{**_NCCL_TUNING, "chapters": (10, 11)}),
    F(key="nccl-pcie-ring-step-latency", value=5.7, unit="µs",
      quantity="latency NCCL's model charges per ring step over PCIe (Simple protocol)", where="hwLat table, PCI "
      "row, Ring (LL/LL128/Simple)", quote="/* Ring (LL/LL128/Simple)*/ { 1.0, 2.5, 5.7 },",
      note="The per-step latency of the course's T4-class (PCIe) node prediction.", **_NCCL_TUNING),
    F(key="nccl-net-ring-step-latency", value=14.0, unit="µs",
      quantity="latency NCCL's model charges per ring step across the network (Simple protocol)", where="hwLat "
      "table, NET row, Ring (LL/LL128/Simple)", quote="/* Ring (LL/LL128/Simple)*/ { 2.7, 4.0, 14.0 },",
      note="For an all-reduce on M > 1 nodes this file's model charges 2 M of a ring's 2 (N - 1) steps at this "
           "latency (plus the topology's own network latency), the rest at the intra-node one, and a base latency "
           "per call; the course's hierarchical model charges 2 (M - 1), so that one GPU per node is the flat ring "
           "on the network.", **_NCCL_TUNING),
    F(key="nvlink4-unidirectional-bandwidth", value=450, unit="GBps",
      quantity="NVLink 4 bandwidth per GPU, one direction (18 links)", hardware="NVIDIA H100, H200, GH200",
      software="not stated (a specification)",
      url="https://github.com/stas00/ml-engineering/blob/d28da7a404a51b8428bd77519ac9c3f9b1821b68/network/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Inter-node and Intra-Node Networking Hardware",
      where="NVLink section, table of effective payload rates",
      quote="| NVLink 4     | 12.50 GBps     |     2 |    18 | 450 GBps     | 900 GBps   | H100, H200, GH200 |",
      chapters=(11,),
      note="The line rate; vendors often quote the 900 GB/s duplex figure. NCCL's ring reaches about 370 of it."),
    F(key="goyal-2017-scaling-efficiency-8-to-256", value=90, unit="%",
      quantity="data-parallel scaling efficiency from 8 to 256 GPUs (ResNet-50, minibatch 8192)",
      hardware="256 GPUs, 8 per server, commodity networking (as the abstract says)", software="Caffe2",
      url="https://arxiv.org/abs/1706.02677",
      title="Goyal et al. 2017, Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour (arXiv:1706.02677)",
      where="abstract",
      quote="Using commodity hardware, our implementation achieves ~90% scaling efficiency when moving from 8 to 256 "
            "GPUs.", chapters=(11,),
      note="Weak scaling: the minibatch grew with the GPUs to 8192 images, with the learning rate scaled linearly "
           "and warmed up (goyal-2017-largest-batch-no-accuracy-loss)."),
    F(key="goyal-2017-largest-batch-no-accuracy-loss", value=8192, unit="images",
      quantity="largest minibatch trained without loss of accuracy (linear scaling rule and warm-up)",
      hardware="256 GPUs, 8 per server, commodity networking (as the abstract says)", software="Caffe2",
      url="https://arxiv.org/abs/1706.02677",
      title="Goyal et al. 2017, Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour (arXiv:1706.02677)",
      where="abstract",
      quote="Specifically, we show no loss of accuracy when training with large minibatch sizes up to 8192 images.",
      chapters=(11,), note="ResNet-50 on ImageNet; the learning rate scaled linearly with the minibatch and warmed up."),
)

MODEL_PARALLEL: tuple[F, ...] = (  # chapter 12: pipeline, tensor, sequence/context parallel, ZeRO/FSDP
    F(key="megatron-1t-fraction-of-peak", value=52, unit="% of peak",
      quantity="per-GPU throughput of a 1-trillion-parameter GPT trained with tensor, pipeline and data parallel",
      hardware="3072 NVIDIA A100 GPUs", software="Megatron-LM (2021)",
      url="https://arxiv.org/abs/2104.04473",
      title="Narayanan, Shoeybi, Casper, LeGresley, Patwary, Korthikanti, Vainbrand, Kashinkunti, Bernauer, "
            "Catanzaro, Phanishayee and Zaharia (2021), Efficient Large-Scale Language Model Training on GPU "
            "Clusters Using Megatron-LM (SC21; arXiv:2104.04473)",
      where="abstract",
      quote="Our approach allows us to perform training iterations on a model with 1 trillion parameters at 502 "
            "petaFLOP/s on 3072 GPUs with achieved per-GPU throughput of 52% of theoretical peak.",
      chapters=(12,),
      note="Against the A100's 312 TFLOP/s 16-bit tensor-core peak (502 / 3072 = 163 TFLOP/s per GPU), with "
           "tensor, pipeline and data parallel combined, and the paper's interleaved pipeline schedule."),
    F(key="megatron-1t-aggregate-petaflops", value=502, unit="petaFLOP/s",
      quantity="aggregate throughput of the same 1-trillion-parameter run", hardware="3072 NVIDIA A100 GPUs",
      software="Megatron-LM (2021)", url="https://arxiv.org/abs/2104.04473",
      title="Narayanan et al. (2021), Efficient Large-Scale Language Model Training on GPU Clusters Using "
            "Megatron-LM (SC21; arXiv:2104.04473)", where="abstract",
      quote="Our approach allows us to perform training iterations on a model with 1 trillion parameters at 502 "
            "petaFLOP/s on 3072 GPUs with achieved per-GPU throughput of 52% of theoretical peak.",
      chapters=(12,), note="502 / 3072 = 163 TFLOP/s per GPU, 52 % of 312."),
    F(key="zero3-communication-vs-ddp", value=1.5, unit="x DDP's communication volume",
      quantity="ZeRO stage 3 (parameters partitioned too) communication per step against plain data parallel",
      quote="The total volume is therefore 3\u03a8 which is 1.5x compared to the baseline.",
      note="Read in a verbatim reproduction of the paper (section 7.2.2, Pos+g+p). Baseline data parallel moves "
           "2\u03a8 per step (reduce-scatter + all-gather of the gradients); ZeRO-1 and ZeRO-2 move the same "
           "2\u03a8; ZeRO-3 adds a second all-gather of the weights for the backward pass.",
      **{**_ZERO_PAPER, "where": "section 7.2.2, communication analysis of ZeRO-DP with parameter partitioning",
         "chapters": (12,)}),
    F(key="nvlink5-max-domain-gpus", value=576, unit="GPUs",
      quantity="GPUs fifth-generation NVLink can join in one NVLink domain (GB200 / GB300 platforms)",
      hardware="NVIDIA GB200 and GB300 systems (NVLink 5, NVLink Switch)", software="not stated (a specification)",
      url="https://docs.nvidia.com/base-command-manager/product-manuals/nvidia-mission-control/nvlinkinfo",
      title="NVIDIA Base Command Manager / Mission Control manual, chapter 7: NVLink Technology",
      where="section 7.1, NVLink Overview (list of what NVLink 5 provides)",
      quote="Support for up to 576 GPUs in a single NVLink domain", chapters=(12,),
      note="An HGX H100 board joins 8 GPUs with NVSwitch; with NVLink 5 and NVLink Switch the domain reaches "
           "beyond one 8-GPU box (the GB200 NVL72 rack is named for its 72 GPUs), so tensor and expert "
           "parallelism need not stop at 8."),
)

_VASWANI = dict(
    hardware="one machine with 8 NVIDIA P100 GPUs", software="not stated (Tensor2Tensor, TensorFlow, 2017)",
    url="https://arxiv.org/abs/1706.03762", title="Attention Is All You Need (Vaswani et al., 2017)", chapters=(13,))
_VASWANI_READ = ("Read in the paper's LaTeX source (training.tex, results.tex) as reproduced verbatim in public copies, "
                 "e.g. https://huggingface.co/datasets/NPULH/agentskillos-benchmark/blob/main/task_data/"
                 "document_creation_task2/paper_src/training.tex.")
_OTT_2018 = dict(
    hardware="a single machine with 8 GPUs, or 16 such machines (128 GPUs); the abstract does not name the GPU "
             "(fairseq's README for the paper requires a Volta GPU for --fp16)",
    software="fairseq (PyTorch), 2018", url="https://arxiv.org/abs/1806.00187v3",
    title="Ott, Edunov, Grangier and Auli (2018), Scaling Neural Machine Translation (WMT 2018; arXiv:1806.00187)",
    where="abstract", chapters=(13,))
_FAIRSEQ_SCALING_NMT = dict(
    hardware="one machine with 8 GPUs (the README's assumption); --fp16 needs a Volta GPU and CUDA 9.1 or greater",
    software="fairseq (fairseq-train), commit 2b7c3e4",
    url="https://github.com/facebookresearch/fairseq/blob/2b7c3e4340f967c08d97be780c20cdacc3db6452/examples/"
        "scaling_nmt/README.md",
    title="fairseq: Scaling Neural Machine Translation (Ott et al., 2018), example README",
    chapters=(13,))
_NVIDIA_DLE_TRANSFORMER = dict(
    software="PyTorch NGC container (pytorch-18.12-py3 for the accuracy runs), fairseq-based scripts",
    url="https://github.com/NVIDIA/DeepLearningExamples/blob/0053b4b88862846fa74df947282a079898d09125/PyTorch/"
        "Translation/Transformer/README.md",
    title="NVIDIA DeepLearningExamples: Transformer for PyTorch (README)", chapters=(13,))
_NVIDIA_DLE_ACCURACY = dict(
    hardware="NVIDIA DGX-1, 8x Tesla V100 16GB",
    where="Results, Training accuracy results: table of BLEU and training time, fp32 and mixed precision, after 32 "
          "epochs (row: GPU count 8)",
    quote="8 | 28.69 | 28.43 | 446 min | 1896 min")
_NVIDIA_DLE_ACCURACY_NOTE = (
    "The same model, data (WMT14 en-de, newstest2014) and 32 epochs in both precisions: mixed precision reached "
    "28.69 BLEU in 446 min, float32 28.43 in 1896 min, so 1896 / 446 = 4.25x less time with the quality kept "
    "(0.26 BLEU apart; the table gives one number per precision, and the README's Known issues say the highest "
    "BLEU reached varies between seeds). "
    "The README's batch rule: 5120 tokens per GPU in mixed precision; in FP32 2560 with --update-freq 2.")

CASE_TRANSLATION: tuple[F, ...] = (  # chapter 13: case study, translation trained fast with its quality kept
    # the paper's base and big runs: steps, step time, days
    F(key="transformer-base-training-steps", value=100000, unit="steps",
      quantity="optimizer steps of the Transformer base model's training run",
      where="§5.2 Hardware and Schedule",
      quote="We trained the base models for a total of 100,000 steps or 12 hours.",
      note="With transformer-base-batch-tokens (about 25,000 source + 25,000 target tokens a step), about 2.5e9 "
           "target tokens seen; 100,000 x 0.4 s = 11.1 hours. " + _VASWANI_READ, **_VASWANI),
    F(key="transformer-big-step-time-8xp100", value=1.0, unit="s",
      quantity="training step time, Transformer big (batches of about 25,000 source + 25,000 target tokens)",
      where="§5.2 Hardware and Schedule",
      quote="step time was 1.0 seconds. The big models were trained for 300,000 steps (3.5 days).",
      note="2.5x the base model's 0.4 s (transformer-base-step-time-8xp100), on the same 8 GPUs and batches. "
           + _VASWANI_READ, **_VASWANI),
    F(key="transformer-big-training-steps", value=300000, unit="steps",
      quantity="optimizer steps of the Transformer big model's training run",
      where="§5.2 Hardware and Schedule",
      quote="The big models were trained for 300,000 steps (3.5 days).",
      note="300,000 x 1.0 s = 83 hours = 3.5 days: the two figures agree. " + _VASWANI_READ, **_VASWANI),
    F(key="transformer-big-training-days-8xp100", value=3.5, unit="days",
      quantity="training time of the Transformer big model, 300,000 steps",
      where="§5.2 Hardware and Schedule",
      quote="The big models were trained for 300,000 steps (3.5 days).",
      note="7x the base model's 12 hours (transformer-base-training-hours-8xp100) for +1.1 BLEU on EN-DE "
           "(28.4 against 27.3). " + _VASWANI_READ, **_VASWANI),
    # the quality those runs reached, and how it was decoded
    F(key="transformer-base-bleu-wmt14-en-de", value=27.3, unit="BLEU",
      quantity="BLEU of the Transformer base model, WMT 2014 English-to-German (newstest2014)",
      where="Table 2 (BLEU, EN-DE column; LaTeX source row)",
      quote="Transformer (base model) & 27.3 & 38.1",
      note="Decoded with beam search (beam 4, length penalty 0.6) from the average of the last 5 checkpoints "
           "(§6.1); tokenized BLEU on WMT data, not comparable with a BLEU on the course's English-Chinese "
           "Tatoeba split. " + _VASWANI_READ, **_VASWANI),
    F(key="transformer-base-bleu-wmt14-en-fr", value=38.1, unit="BLEU",
      quantity="BLEU of the Transformer base model, WMT 2014 English-to-French (newstest2014)",
      where="Table 2 (BLEU, EN-FR column; LaTeX source row)",
      quote="Transformer (base model) & 27.3 & 38.1",
      note="English-French had 36 M training sentences against 4.5 M for English-German (§5.1). "
           + _VASWANI_READ, **_VASWANI),
    F(key="transformer-big-bleu-wmt14-en-de", value=28.4, unit="BLEU",
      quantity="BLEU of the Transformer big model, WMT 2014 English-to-German (newstest2014)",
      where="abstract (the same number is Table 2's Transformer (big) row)",
      quote="Our model achieves 28.4 BLEU on the WMT 2014 English-to-German translation task",
      note="Average of the last 20 checkpoints, beam 4, length penalty 0.6 (§6.1). " + _VASWANI_READ,
      **_VASWANI),
    F(key="transformer-big-bleu-wmt14-en-fr", value=41.8, unit="BLEU",
      quantity="BLEU of the Transformer big model, WMT 2014 English-to-French (newstest2014)",
      where="abstract (the same number is Table 2's Transformer (big) row)",
      quote="our model establishes a new single-model state-of-the-art BLEU score of 41.8 after training for 3.5 "
            "days on eight GPUs",
      note="The paper's §6.1 text still says 41.0 for this model (the figure of the paper's first arXiv "
           "versions); the abstract and Table 2 of the current version say 41.8. " + _VASWANI_READ, **_VASWANI),
    F(key="transformer-beam-size", value=4, unit="hypotheses",
      quantity="beam size used to decode the translation results",
      where="§6.1 Machine Translation",
      quote="We used beam search with a beam size of 4 and length penalty \u03b1 = 0.6",
      note="Chosen on the development set; maximum output length input length + 50, stopping early when "
           "possible. A beam of 4 runs the decoder on 4 hypotheses per sentence at each step. " + _VASWANI_READ,
      **_VASWANI),
    F(key="transformer-length-penalty-alpha", value=0.6, unit="(alpha)",
      quantity="length penalty alpha of the beam search (GNMT's length normalisation, Wu et al. 2016)",
      where="§6.1 Machine Translation",
      quote="We used beam search with a beam size of 4 and length penalty \u03b1 = 0.6",
      note="Without a length penalty a beam prefers short outputs, whose summed log-probability is less "
           "negative. " + _VASWANI_READ, **_VASWANI),
    # the data the paper's 12 hours bought
    F(key="wmt14-en-de-sentence-pairs", value=4.5, unit="million sentence pairs",
      quantity="training data of the WMT 2014 English-German task as the paper used it",
      where="§5.1 Training Data and Batching",
      quote="We trained on the standard WMT 2014 English-German dataset consisting of about 4.5 million sentence "
            "pairs.",
      note="About 150 times the course's 29,155 Tatoeba English-Chinese pairs (shared/data/README.md): the "
           "paper's 12 hours on 8 GPUs trained on far more data than a CPU preset sees. " + _VASWANI_READ,
      **{**_VASWANI, "hardware": "not hardware: the size of a data set"}),
    F(key="transformer-wmt14-en-de-bpe-vocab", value=37000, unit="tokens",
      quantity="shared source-target byte-pair-encoding vocabulary, WMT 2014 English-German",
      where="§5.1 Training Data and Batching",
      quote="which has a shared source-target vocabulary of about 37000 tokens.",
      note="The width of the output projection and softmax at every target position; English-French used a "
           "32000 word-piece vocabulary. " + _VASWANI_READ,
      **{**_VASWANI, "hardware": "not hardware: a tokenizer choice"}),
    # reduced precision and large batches on 8 and 128 GPUs (Ott et al. 2018)
    F(key="ott-2018-speedup-8-gpus", value=5, unit="x (nearly)",
      quantity="training speed-up from reduced precision and large batches on one 8-GPU machine",
      quote="This paper shows that reduced precision and large batch training can speedup training by nearly 5x "
            "on a single 8-GPU machine with careful tuning and implementation.",
      note="Two accelerations together (reduced precision and larger batches), against the authors' own "
           "baseline on the same machine; the abstract gives the combined figure, not each one's share.",
      **_OTT_2018),
    F(key="ott-2018-hours-to-vaswani-bleu-8-gpus", value=5, unit="hours (under)",
      quantity="time to match Vaswani et al.'s WMT'14 English-German accuracy on 8 GPUs",
      quote="On WMT'14 English-German translation, we match the accuracy of Vaswani et al. (2017) in under 5 "
            "hours when training on 8 GPUs",
      note="A time-to-quality figure: the quality the big model reached in 3.5 days on 8 P100s "
           "(transformer-big-training-days-8xp100), with reduced precision and large batches.",
      **_OTT_2018),
    F(key="ott-2018-bleu-en-de-128-gpus", value=29.3, unit="BLEU",
      quantity="BLEU on WMT'14 English-German after the 128-GPU run",
      quote="we obtain a new state of the art of 29.3 BLEU after training for 85 minutes on 128 GPUs",
      note="Quality rose (against 28.4, transformer-big-bleu-wmt14-en-de) while time fell: larger batches with a "
           "larger learning rate (fairseq-scaling-nmt-update-freq), not the same recipe run faster.",
      **_OTT_2018),
    F(key="ott-2018-minutes-128-gpus", value=85, unit="minutes",
      quantity="training time to 29.3 BLEU on WMT'14 English-German on 128 GPUs (16 machines of 8)",
      quote="we obtain a new state of the art of 29.3 BLEU after training for 85 minutes on 128 GPUs",
      note="16x the GPUs of the 8-GPU run; the 8-GPU run matched 28.4 in under 5 hours "
           "(ott-2018-hours-to-vaswani-bleu-8-gpus).", **_OTT_2018),
    F(key="fairseq-scaling-nmt-max-tokens-per-gpu", value=3584, unit="tokens",
      quantity="batch size per GPU as a token budget (--max-tokens) in the recipe reproducing Ott et al. 2018",
      where="Training a new model on WMT'16 En-De, step 3 (the fairseq-train command, with --fp16)",
      quote="--max-tokens 3584",
      note="Batches sized by tokens, not sentences: 8 GPUs x 3584 = 28,672 tokens per step, about the paper's "
           "25,000 (transformer-base-batch-tokens).", **_FAIRSEQ_SCALING_NMT),
    F(key="fairseq-scaling-nmt-update-freq", value=16, unit="micro-batches per step",
      quantity="gradient accumulation (--update-freq) that simulates 128 GPUs on an 8-GPU machine",
      where="Training a new model on WMT'16 En-De, after step 3 (training with big batches)",
      quote="add `--update-freq 16` to simulate training on 8*16=128 GPUs",
      note="The README adds: increase the learning rate; 0.001 works well for big batches. Accumulation gives "
           "the large batch's optimisation, not the 128 GPUs' speed: each step runs 16 forward-backward passes.",
      **_FAIRSEQ_SCALING_NMT),
    # mixed precision against float32 with the quality measured (NVIDIA's reference Transformer)
    F(key="nvidia-transformer-8xv100-amp-bleu", value=28.69, unit="BLEU",
      quantity="BLEU after 32 epochs in mixed precision, Transformer big on WMT14 en-de, 8 GPUs",
      note=_NVIDIA_DLE_ACCURACY_NOTE, **_NVIDIA_DLE_ACCURACY, **_NVIDIA_DLE_TRANSFORMER),
    F(key="nvidia-transformer-8xv100-fp32-bleu", value=28.43, unit="BLEU",
      quantity="BLEU after 32 epochs in float32, Transformer big on WMT14 en-de, 8 GPUs",
      note=_NVIDIA_DLE_ACCURACY_NOTE, **_NVIDIA_DLE_ACCURACY, **_NVIDIA_DLE_TRANSFORMER),
    F(key="nvidia-transformer-8xv100-amp-training-minutes", value=446, unit="min",
      quantity="training time for 32 epochs in mixed precision, Transformer big on WMT14 en-de, 8 GPUs",
      note=_NVIDIA_DLE_ACCURACY_NOTE, **_NVIDIA_DLE_ACCURACY, **_NVIDIA_DLE_TRANSFORMER),
    F(key="nvidia-transformer-8xv100-fp32-training-minutes", value=1896, unit="min",
      quantity="training time for 32 epochs in float32, Transformer big on WMT14 en-de, 8 GPUs",
      note=_NVIDIA_DLE_ACCURACY_NOTE, **_NVIDIA_DLE_ACCURACY, **_NVIDIA_DLE_TRANSFORMER),
    F(key="nvidia-transformer-v100-amp-inference-speedup", value=1.76, unit="x",
      quantity="beam-search translation throughput, mixed precision (fp16) over float32, one GPU",
      hardware="1 NVIDIA Tesla V100-SXM2-32GB",
      where="Results, Inference performance results (generate.py --beam 4 --fp16, pytorch-19.03-py3 container, "
            "a single GPU): columns Mixed precision, FP32, FP16/Mixed speedup",
      quote="Tesla V100-SXM2-32GB | 6010 | 3414 | 1.76",
      note="Decoding gains less from fp16 than training does (3.12x on one V100, "
           "transformer-v100-amp-training-speedup): a beam-search step works on a few tokens per sentence, so "
           "it is likely bound by memory traffic and launches more than by tensor-core arithmetic. The table does not "
           "state the unit of 6010 and 3414 (generate.py reports a mean throughput).",
      **_NVIDIA_DLE_TRANSFORMER),
)

_PATCHTST = dict(
    hardware="not stated in the README (the paper's experiments)", software="the authors' PyTorch code (PatchTST_supervised)",
    url="https://github.com/yuqinie98/PatchTST", title="PatchTST (ICLR 2023): official implementation, README",
    chapters=(15,))
_LTSF_LINEAR = dict(
    hardware="not stated in the README", software="the authors' PyTorch code (LTSF-Linear)",
    url="https://github.com/cure-lab/LTSF-Linear",
    title="Are Transformers Effective for Time Series Forecasting? (AAAI 2023): official implementation, README",
    chapters=(15,))

_LTSF_TABLE2 = dict(
    hardware="not stated in the table (the paper's experiments)",
    software="the authors' PyTorch code (LTSF-Linear); its test loader then dropped the last incomplete batch "
             "(drop_last=True, changed to False in commit 6fe4c28 of 2023-03-15)",
    url="https://github.com/cure-lab/LTSF-Linear/blob/0c113668a3b88c4c4ee586b8c5ec3e539c4de5a6/pics/Mul-results.png",
    title="Zeng et al., Are Transformers Effective for Time Series Forecasting? (AAAI 2023, arXiv 2205.13504): "
          "Table 2, as the official repository's README shows it (the image pics/Mul-results.png)",
    chapters=(15,))
_PATCHTST_TABLE3 = dict(
    hardware="not stated in the table (the paper's experiments)",
    software="the authors' PyTorch code (PatchTST_supervised); its test loader drops the last incomplete batch "
             "(drop_last=True)",
    url="https://github.com/yuqinie98/PatchTST/blob/204c21efe0b39603ad6e2ca640ef5896646ab1a9/pic/table3.png",
    title="Nie et al., A Time Series is Worth 64 Words: Long-term Forecasting with Transformers (ICLR 2023, "
          "arXiv 2211.14730): Table 3, as the official repository's README shows it (the image pic/table3.png)",
    chapters=(15,))
_FITS_RERUN = dict(
    hardware="not stated for these runs", software="the baselines' official code, freshly cloned, with the original "
             "hyper-parameters and the test loader's drop_last set to False",
    url="https://github.com/VEWOXIC/FITS",
    title="FITS: Modeling Time Series with 10k parameters (ICLR 2024 Spotlight): official implementation, README",
    where="Result Update, first table (MSE), column ETTh1-96", chapters=(15,))
_ETTH1_SPLIT = ("ETTh1 is split by time, 12/4/4 months for train/validation/test, and every channel is standardised "
                "with the training months' mean and deviation (the official code: data_provider/data_loader.py, "
                "Dataset_ETT_hour, border1s/border2s and StandardScaler fitted on train_data); the table itself does "
                "not restate it. ")
_TRANSCRIBED = ("The README shows the table only as an image: the quote is the row transcribed from it, cells in "
                "order, separated by spaces. ")

FORECASTING: tuple[F, ...] = (  # chapter 15: case study, stock prices and a forecasting benchmark
    F(key="patchtst-64-mse-reduction", value=21.0, unit="%",
      quantity="overall MSE reduction of PatchTST/64 against the best Transformer-based forecasters, supervised",
      where="Results, Supervised Learning",
      quote="PatchTST/64 achieves an overall **21.0%** reduction on MSE and **16.7%** reduction on MAE, while "
            "PatchTST/42 attains a overall **20.2%** reduction on MSE and **16.4%** reduction on MAE. It also "
            "outperforms other non-Transformer-based models like DLinear.",
      note="Over the long-horizon benchmarks of Nie et al. 2023 (Weather, Traffic, Electricity, ILI, ETT). "
           "(The README breaks the line between 'reduction' and 'on MAE'; 'a overall' is its spelling.) "
           "The benchmarks' data, horizons (96-720 steps) and look-back windows are not this chapter's.",
      **_PATCHTST),
    F(key="patchtst-64-mae-reduction", value=16.7, unit="%",
      quantity="overall MAE reduction of PatchTST/64 against the best Transformer-based forecasters, supervised",
      where="Results, Supervised Learning",
      quote="PatchTST/64 achieves an overall **21.0%** reduction on MSE and **16.7%** reduction",
      note="The same comparison as patchtst-64-mse-reduction, in mean absolute error.", **_PATCHTST),
    F(key="ltsf-linear-default-lookback", value=336, unit="time steps",
      quantity="default look-back window of the LTSF-Linear (Linear, NLinear, DLinear) scripts",
      where="Getting Started, Training Example",
      quote="The default look-back window in scripts is 336, LTSF-Linear generally achieves better results with "
            "longer look-back window as dicussed in the paper.",
      note="Chapter 15's window is also 336 steps: one week of half-hours. ('dicussed' is the README's spelling.)",
      **_LTSF_LINEAR),
    # published ETTh1 results at horizon 96, multivariate (the benchmark chapter 15 rebuilds)
    F(key="ltsf-linear-etth1-96-mse", value=0.375, unit="MSE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MSE of Linear on the "
               "training-standardised scale",
      where="Table 2, row ETTh1 96; cells IMP., Linear* MSE, MAE, NLinear* MSE, MAE, DLinear* MSE, MAE",
      quote="96 0.80% 0.375 0.397 0.374 0.394 0.375 0.399",
      note=_TRANSCRIBED + _ETTH1_SPLIT + "The table does not state the look-back; the official scripts use 336 "
           "(ltsf-linear-default-lookback). The same numbers are in the repository's LTSF-Benchmark.md as text "
           "('|Linear|MSE|0.375|0.418|...'), under 'best input length'. Evaluated with drop_last=True: with the "
           "script's batch of 32 the last incomplete test batch is dropped.", **_LTSF_TABLE2),
    F(key="ltsf-linear-etth1-96-mae", value=0.397, unit="MAE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MAE of Linear on the "
               "training-standardised scale",
      where="Table 2, row ETTh1 96; cells IMP., Linear* MSE, MAE, NLinear* MSE, MAE, DLinear* MSE, MAE",
      quote="96 0.80% 0.375 0.397 0.374 0.394 0.375 0.399",
      note="The same row as ltsf-linear-etth1-96-mse, Linear's MAE (the second number after 0.80%).",
      **_LTSF_TABLE2),
    F(key="ltsf-nlinear-etth1-96-mse", value=0.374, unit="MSE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MSE of NLinear on the "
               "training-standardised scale",
      where="Table 2, row ETTh1 96; cells IMP., Linear* MSE, MAE, NLinear* MSE, MAE, DLinear* MSE, MAE",
      quote="96 0.80% 0.375 0.397 0.374 0.394 0.375 0.399",
      note="The same row as ltsf-linear-etth1-96-mse (split, look-back and drop_last as there); NLinear's MSE is "
           "in bold in the table, the row's best.", **_LTSF_TABLE2),
    F(key="ltsf-nlinear-etth1-96-mae", value=0.394, unit="MAE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MAE of NLinear on the "
               "training-standardised scale",
      where="Table 2, row ETTh1 96; cells IMP., Linear* MSE, MAE, NLinear* MSE, MAE, DLinear* MSE, MAE",
      quote="96 0.80% 0.375 0.397 0.374 0.394 0.375 0.399",
      note="The same row as ltsf-linear-etth1-96-mse, NLinear's MAE (in bold in the table).", **_LTSF_TABLE2),
    F(key="ltsf-dlinear-etth1-96-mse", value=0.375, unit="MSE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MSE of DLinear on the "
               "training-standardised scale",
      where="Table 2, row ETTh1 96; cells IMP., Linear* MSE, MAE, NLinear* MSE, MAE, DLinear* MSE, MAE",
      quote="96 0.80% 0.375 0.397 0.374 0.394 0.375 0.399",
      note="The same row as ltsf-linear-etth1-96-mse; DLinear's MSE is the fifth number after 0.80% (Linear's is "
           "also 0.375). PatchTST's Table 3 quotes the same 0.375 and 0.399 for DLinear "
           "(patchtst-table3-dlinear-etth1-96-mse); FITS's rerun with the whole test set gives 0.384 "
           "(fits-rerun-dlinear-etth1-96-mse).", **_LTSF_TABLE2),
    F(key="ltsf-dlinear-etth1-96-mae", value=0.399, unit="MAE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MAE of DLinear on the "
               "training-standardised scale",
      where="Table 2, row ETTh1 96; cells IMP., Linear* MSE, MAE, NLinear* MSE, MAE, DLinear* MSE, MAE",
      quote="96 0.80% 0.375 0.397 0.374 0.394 0.375 0.399",
      note="The same row as ltsf-linear-etth1-96-mse, DLinear's MAE (the last number).", **_LTSF_TABLE2),
    F(key="patchtst-42-etth1-96-mse", value=0.375, unit="MSE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MSE of supervised PatchTST/42 "
               "on the training-standardised scale",
      where="Table 3, row ETTh1 96; cells PatchTST/64 MSE, MAE, PatchTST/42 MSE, MAE, DLinear MSE, MAE",
      quote="96 0.370 0.400 0.375 0.399 0.375 0.399",
      note=_TRANSCRIBED + _ETTH1_SPLIT + "The table does not state the look-back. PatchTST/42 is the README's "
           "default model and scripts/PatchTST/etth1.sh uses seq_len=336, patch_len 16, stride 8: "
           "(336-16)/8+1 = 41 patches plus one from end padding = 42. Evaluated with drop_last=True and the "
           "script's batch of 128.", **_PATCHTST_TABLE3),
    F(key="patchtst-42-etth1-96-mae", value=0.399, unit="MAE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MAE of supervised PatchTST/42 "
               "on the training-standardised scale",
      where="Table 3, row ETTh1 96; cells PatchTST/64 MSE, MAE, PatchTST/42 MSE, MAE, DLinear MSE, MAE",
      quote="96 0.370 0.400 0.375 0.399 0.375 0.399",
      note="The same row as patchtst-42-etth1-96-mse, PatchTST/42's MAE (in bold in the table).",
      **_PATCHTST_TABLE3),
    F(key="patchtst-64-etth1-96-mse", value=0.370, unit="MSE",
      quantity="ETTh1, multivariate (7 channels), look-back 512, horizon 96: test MSE of supervised PatchTST/64 "
               "on the training-standardised scale",
      where="Table 3, row ETTh1 96; cells PatchTST/64 MSE, MAE, PatchTST/42 MSE, MAE, DLinear MSE, MAE",
      quote="96 0.370 0.400 0.375 0.399 0.375 0.399",
      note=_TRANSCRIBED + "Split, scaling and drop_last as in patchtst-42-etth1-96-mse. The table does not state the "
           "look-back and the repository has no PatchTST/64 script for ETTh1: 64 patches of 16 with stride 8 and end "
           "padding means a look-back of 512 ((512-16)/8+1 = 63, plus 1). The best MSE in the row (bold).",
      **_PATCHTST_TABLE3),
    F(key="patchtst-64-etth1-96-mae", value=0.400, unit="MAE",
      quantity="ETTh1, multivariate (7 channels), look-back 512, horizon 96: test MAE of supervised PatchTST/64 "
               "on the training-standardised scale",
      where="Table 3, row ETTh1 96; cells PatchTST/64 MSE, MAE, PatchTST/42 MSE, MAE, DLinear MSE, MAE",
      quote="96 0.370 0.400 0.375 0.399 0.375 0.399",
      note="The same row as patchtst-64-etth1-96-mse, PatchTST/64's MAE (underlined: second best).",
      **_PATCHTST_TABLE3),
    F(key="patchtst-table3-dlinear-etth1-96-mse", value=0.375, unit="MSE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MSE of DLinear as PatchTST's "
               "Table 3 quotes it, on the training-standardised scale",
      where="Table 3, row ETTh1 96; cells PatchTST/64 MSE, MAE, PatchTST/42 MSE, MAE, DLinear MSE, MAE",
      quote="96 0.370 0.400 0.375 0.399 0.375 0.399",
      note="DLinear's MSE is the fifth number (PatchTST/42's is also 0.375): the same 0.375 as the LTSF-Linear "
           "paper's own Table 2 (ltsf-dlinear-etth1-96-mse), from which it is presumably copied; the table does not "
           "say.", **_PATCHTST_TABLE3),
    F(key="patchtst-table3-dlinear-etth1-96-mae", value=0.399, unit="MAE",
      quantity="ETTh1, multivariate (7 channels), look-back 336, horizon 96: test MAE of DLinear as PatchTST's "
               "Table 3 quotes it, on the training-standardised scale",
      where="Table 3, row ETTh1 96; cells PatchTST/64 MSE, MAE, PatchTST/42 MSE, MAE, DLinear MSE, MAE",
      quote="96 0.370 0.400 0.375 0.399 0.375 0.399",
      note="DLinear's MAE is the last number (in bold, tied with PatchTST/42's): as in ltsf-dlinear-etth1-96-mae.",
      **_PATCHTST_TABLE3),
    # the test loader's drop_last: the published numbers above skip the last incomplete batch of test windows
    F(key="fits-rerun-patchtst-etth1-96-mse", value=0.385, unit="MSE",
      quantity="ETTh1, multivariate, horizon 96: test MSE of PatchTST rerun with its official code and "
               "hyper-parameters on the whole test set (drop_last=False)",
      quote="| PatchTST  | 0.385     | *0.413*   | *0.44*    | *0.456*   |",
      note="FITS's authors reran the baselines after finding the drop_last bug ('the test dataloader uses "
           "`drop_last=True`, which may exclude a significant portion of test data, particularly with large batch "
           "sizes'). The official ETTh1 script is PatchTST/42 (look-back 336); the README does not restate the "
           "look-back. Against the published 0.375 (patchtst-42-etth1-96-mse); a single rerun, seed not stated.",
      **_FITS_RERUN),
    F(key="fits-rerun-dlinear-etth1-96-mse", value=0.384, unit="MSE",
      quantity="ETTh1, multivariate, horizon 96: test MSE of DLinear rerun with its official code and "
               "hyper-parameters on the whole test set (drop_last=False)",
      quote="| Dlinear   | 0.384     | 0.443     | 0.446     | 0.504     |",
      note="As fits-rerun-patchtst-etth1-96-mse; the official DLinear ETTh1 script uses look-back 336. Against the "
           "published 0.375 (ltsf-dlinear-etth1-96-mse). ('Dlinear' is the README's spelling.)", **_FITS_RERUN),
    F(key="patchtst-etth1-script-batch-size", value=128, unit="windows per batch",
      quantity="batch size of the official PatchTST ETTh1 script, which the test loader also uses "
               "(batch_size = args.batch_size with drop_last=True for flag 'test')",
      hardware="not applicable (a script setting)", software="the authors' PyTorch code (PatchTST_supervised)",
      url="https://github.com/yuqinie98/PatchTST/blob/204c21efe0b39603ad6e2ca640ef5896646ab1a9/PatchTST_supervised/"
          "scripts/PatchTST/etth1.sh",
      title="PatchTST (ICLR 2023): official implementation, PatchTST_supervised/scripts/PatchTST/etth1.sh",
      where="the python -u run_longExp.py command's last line",
      quote="--itr 1 --batch_size 128 --learning_rate 0.0001",
      note="PatchTST_supervised/data_provider/data_factory.py sets, for flag == 'test', 'drop_last = True' and "
           "'batch_size = args.batch_size': the test windows beyond the last whole batch of 128 are not scored.",
      chapters=(15,)),
    F(key="patchtst-etth1-script-epochs", value=100, unit="epochs",
      quantity="training epochs of the official PatchTST ETTh1 script (look-back 336, horizons 96-720)",
      hardware="not applicable (a script setting)", software="the authors' PyTorch code (PatchTST_supervised)",
      url="https://github.com/yuqinie98/PatchTST/blob/b75156c0bce8cfc11babe3ef1f1a0430e9bd5964/PatchTST_supervised/"
          "scripts/PatchTST/etth1.sh",
      title="PatchTST (ICLR 2023): official implementation, PatchTST_supervised/scripts/PatchTST/etth1.sh",
      where="the python -u run_longExp.py command's arguments",
      quote="--train_epochs 100",
      note="The same command sets --e_layers 3, --n_heads 4, --d_model 16, --d_ff 128, --dropout 0.3, --patch_len 16 "
           "and --stride 8 (the sizes of ltsf.ETTH1_PATCHTST) and the learning rate of patchtst-etth1-script-batch-size's "
           "quote. Chapter 15's CPU book run trains far fewer epochs at a higher peak rate, and says so.",
      chapters=(15,)),
    F(key="ltsf-linear-etth1-script-batch-size", value=32, unit="windows per batch",
      quantity="batch size of the official LTSF-Linear ETTh1 script (Linear, NLinear and DLinear), which the test "
               "loader also uses",
      hardware="not applicable (a script setting)", software="the authors' PyTorch code (LTSF-Linear)",
      url="https://github.com/cure-lab/LTSF-Linear/blob/0c113668a3b88c4c4ee586b8c5ec3e539c4de5a6/scripts/"
          "EXP-LongForecasting/Linear/etth1.sh",
      title="LTSF-Linear (AAAI 2023): official implementation, scripts/EXP-LongForecasting/Linear/etth1.sh",
      where="each python -u run_longExp.py command's last line (pred_len 96, 192, 336, 720)",
      quote="--itr 1 --batch_size 32 --learning_rate 0.005",
      note="The test loader used drop_last=True until commit 6fe4c28 (2023-03-15) set it to False in "
           "data_provider/data_factory.py, after the paper's results were published.", chapters=(15,)),
)

_ESM2 = dict(
    hardware="not named in the quoted abstract", software="the authors' ESM-2 / ESMFold code (fair-esm)",
    url="https://www.biorxiv.org/content/10.1101/2022.07.20.500902v2.full",
    title="Lin et al. 2022/2023, Evolutionary-scale prediction of atomic level protein structure with a language model "
          "(bioRxiv 2022.07.20.500902v2; Science 2023)", where="Abstract", chapters=(14,))

_PROTTRANS = dict(
    hardware="Summit supercomputer (5616 GPUs) and TPU Pods (up to 1024 cores)", software="not stated in the abstract",
    url="https://storage.prod.researchhub.com/uploads/papers/2023/10/11/pdf_extract/1302168.html",
    title="Elnaggar et al., ProtTrans: Toward Understanding the Language of Life Through Self-Supervised Learning "
          "(IEEE TPAMI 44(10), 2022)", where="Abstract", chapters=(14,))

PROTEINS: tuple[F, ...] = (  # chapter 14: case study, protein sequences
    F(key="esm2-largest-parameters", value=15, unit="billion parameters",
      quantity="parameters of the largest ESM-2 protein language model",
      quote="we train models up to 15B parameters, the largest language model of proteins to date",
      note="A masked (encoder) language model trained on UniRef sequences; chapter 14's causal models (sizes "
           "printed on its page, per device) are orders of magnitude smaller and train on 20,000 proteins.", **_ESM2),
    F(key="esmfold-speedup-vs-sota", value=60, unit="x",
      quantity="speed of ESMFold's structure prediction against the state of the art, at most (the quoted sentence "
               "does not name the method compared)",
      quote="This results in prediction that is up to 60x faster than state-of-the-art while maintaining resolution "
            "and accuracy.",
      note="An inference speedup from dropping the multiple-sequence-alignment search, not a training speedup.",
      **_ESM2),
    F(key="esm-atlas-structures-millions", value=617, unit="million structures",
      quantity="predicted structures of metagenomic proteins in the ESM Metagenomic Atlas",
      quote="This is the first large-scale structural characterization of metagenomic proteins, with more than 617 "
            "million structures.",
      note="What a sequence-only model's speed made possible at scale.", **_ESM2),
    F(key="prottrans-summit-gpus", value=5616, unit="GPUs",
      quantity="GPUs of the Summit supercomputer used to train the ProtTrans protein language models",
      quote="The protein LMs (pLMs) were trained on the Summit supercomputer using 5616 GPUs and TPU Pod up-to 1024 "
            "cores.",
      note="The compute of protein language models at scale; the same sentence gives TPU Pods of up to 1024 cores.",
      **_PROTTRANS),
    F(key="prottrans-amino-acids-billions", value=393, unit="billion amino acids",
      quantity="largest ProtTrans training set (UniRef and BFD), in amino acids",
      quote="Here, we trained two auto-regressive models (Transformer-XL, XLNet) and four auto-encoder models (BERT, "
            "Albert, Electra, T5) on data from UniRef and BFD containing up to 393 billion amino acids.",
      note="Against chapter 14's corpus of 20,000 proteins.", **_PROTTRANS),
)

_PT2 = dict(
    url="https://github.com/pytorch/pytorch.github.io/blob/01a1591c05eec011ff6288cb405ad3db8cd8e9b0/_get_started/"
        "pytorch.md",
    title="PyTorch 2.x: faster, more pythonic and as dynamic as ever (pytorch.org's PyTorch 2.0 overview page; its "
          "source in pytorch/pytorch.github.io)",
    hardware="NVIDIA A100 (one GPU)", software="PyTorch 2.0 nightly binaries (before the first stable 2.0 release), torch.compile with TorchInductor",
    where="section 'PyTorch 2.x: faster, more pythonic and as dynamic as ever'", chapters=(16,))
_CUDA_GRAPHS = dict(
    url="https://github.com/pytorch/pytorch.github.io/blob/18894bcaa8a8873287768e4a07d73d58889f8648/_posts/"
        "2021-10-26-accelerating-pytorch-with-cuda-graphs.md",
    title="Accelerating PyTorch with CUDA Graphs (PyTorch blog, Nguyen, Carilli, Eryilmaz et al., October 2021)",
    software="PyTorch 1.10 CUDA graphs API (torch.cuda.graph, make_graphed_callables), NVIDIA MLPerf training v1.0 "
             "code", chapters=(16,))
_GPT_FAST = dict(url="https://github.com/pytorch-labs/gpt-fast", title="gpt-fast (README)",
                 software="PyTorch nightly (late 2023), gpt-fast, torch.compile", chapters=(16,))
_GPT_FAST_A100 = "NVIDIA A100-80GB (one of 8, power-limited to 330 W)"
_BERT_DYNAMIC_QUANT = dict(
    hardware="a MacBook Pro CPU (model not stated)",
    software="PyTorch torch.quantization.quantize_dynamic (nn.Linear to qint8), HuggingFace transformers "
             "(the tutorial installs 4.29.2); fine-tuned bert-base-uncased on GLUE MRPC, 408 evaluation examples",
    url="https://github.com/pytorch/tutorials/blob/0310be69c9e2adc6aad448a361c482ba8cb1a70a/intermediate_source/"
        "dynamic_quantization_bert_tutorial.rst",
    title="(beta) Dynamic Quantization on BERT (PyTorch tutorial, Jianyu Huang)",
    where="3.2 Evaluate the inference accuracy and time: results table (columns Prec, F1 score, Model Size, "
          "1 thread, 4 threads)", chapters=(16,))
_BERT_FP32_ROW = "| FP32 |  0.9019  |   438 MB   | 160 sec  | 85 sec    |"
_BERT_INT8_ROW = "| INT8 |  0.902   |   181 MB   |  90 sec  | 46 sec    |"
_DISTILBERT = dict(
    hardware="not stated in the abstract", software="not stated in the abstract",
    url="https://arxiv.org/abs/1910.01108",
    title="DistilBERT, a distilled version of BERT: smaller, faster, cheaper and lighter (Sanh, Debut, Chaumond "
          "and Wolf, 2019; arXiv:1910.01108)",
    where="abstract (read as reproduced verbatim for arXiv 1910.01108v4 at "
          "https://www.scholarfeed.org/paper/1910.01108v4)",
    quote="it is possible to reduce the size of a BERT model by 40%, while retaining 97% of its language "
          "understanding capabilities and being 60% faster.", chapters=(16,))

TOOLS: tuple[F, ...] = (  # chapter 16: compilers, CUDA graphs, XLA/TPU, export, compression, profilers, ROCm
    # torch.compile as PyTorch published it
    F(key="torch-compile-a100-training-speedup", value=43, unit="% faster (weighted mean over 163 models)",
      quantity="training speed of torch.compile over eager, mean over 163 open-source models (HuggingFace, TIMM, "
               "TorchBench), weighted 0.75 x AMP + 0.25 x float32",
      quote="Across these 163 open-source models `torch.compile` works 93% of time, and the model runs 43% faster "
            "in training on an NVIDIA A100 GPU.",
      note="A mean over many models on a server GPU; the page adds that on a desktop GPU (RTX 3090) the speedups "
           "are lower. Compare with the compile speedup measured on this page's device, and with its compile time, "
           "which the page does not give.", **_PT2),
    F(key="torch-compile-a100-amp-speedup", value=51, unit="% faster (mean over 163 models)",
      quantity="training speed of torch.compile over eager in automatic mixed precision (AMP)",
      quote="At Float32 precision, it runs 21% faster on average and at AMP Precision it runs 51% faster on "
            "average.",
      note="The page measures both precisions because 'speedups can be dependent on data-type'.", **_PT2),
    F(key="torch-compile-a100-fp32-speedup", value=21, unit="% faster (mean over 163 models)",
      quantity="training speed of torch.compile over eager in float32",
      quote="At Float32 precision, it runs 21% faster on average and at AMP Precision it runs 51% faster on "
            "average.", **_PT2),
    F(key="torch-compile-works-share", value=93, unit="% of models",
      quantity="share of the 163 benchmark models torch.compile compiled and ran correctly",
      quote="Across these 163 open-source models `torch.compile` works 93% of time, and the model runs 43% faster "
            "in training on an NVIDIA A100 GPU.",
      note="Not every model compiles: graph breaks and failures are why the chapter shows torch._dynamo.explain.",
      **_PT2),
    # CUDA graphs
    F(key="cuda-graphs-mlperf-mask-rcnn-speedup", value=1.70, unit="x",
      quantity="MLPerf training v1.0 Mask R-CNN, speedup from CUDA graphs",
      hardware="272 NVIDIA GPUs (the post does not name the model)",
      where="Example use cases, Table 1: MLPerf training v1.0 performance improvement with PyTorch CUDA graph",
      quote="| Mask R-CNN                  | 272             | 1.70×                    |",
      note="Per-GPU batch size 1: the CPU could not launch kernels fast enough, so removing launch overhead paid "
           "most. Only the backbone was graphed.", **_CUDA_GRAPHS),
    F(key="cuda-graphs-mlperf-bert-speedup", value=1.12, unit="x",
      quantity="MLPerf training v1.0 BERT at its largest scale, speedup from CUDA graphs",
      hardware="4096 NVIDIA GPUs (the post does not name the model)",
      where="Example use cases, Table 1: MLPerf training v1.0 performance improvement with PyTorch CUDA graph",
      quote="| BERT                        | 4096            | 1.12×                    |",
      note="Capturing the whole model needed static shapes (a mask instead of gathering the valid tokens) and no "
           "CPU-GPU synchronisation inside the step.", **_CUDA_GRAPHS),
    F(key="cuda-graphs-mask-rcnn-backbone-ms-before", value=31, unit="ms",
      quantity="time of the Mask R-CNN backbone before CUDA graphs, read on an Nsight Systems timeline "
               "(per-GPU batch 1; the CPU at 100 % load, the GPU idle between kernels)",
      hardware="one NVIDIA GPU of the MLPerf v1.0 Mask R-CNN run (the post does not name the model)",
      where="Example use cases, Mask R-CNN (Figures 3 and 4: NSight timeline plots)",
      quote="The graphed portion now runs in 6 ms instead of 31ms, a speedup of 5x.",
      note="The Nsight Systems example of the chapter: a timeline showing gaps between kernels (launch-bound) "
           "and the same region after graphing. 5x on the graphed region became about 1.7x for the whole step.",
      **_CUDA_GRAPHS),
    F(key="cuda-graphs-mask-rcnn-backbone-ms-after", value=6, unit="ms",
      quantity="time of the same Mask R-CNN backbone region after CUDA graphs (Nsight Systems timeline)",
      hardware="one NVIDIA GPU of the MLPerf v1.0 Mask R-CNN run (the post does not name the model)",
      where="Example use cases, Mask R-CNN (Figure 4: CUDA graphs optimization)",
      quote="The graphed portion now runs in 6 ms instead of 31ms, a speedup of 5x.", **_CUDA_GRAPHS),
    # Nsight Compute: llm.c's profile_gpt2cu.py reads each kernel's counters from an `ncu --set full` report
    F(key="ncu-llmc-encoder-forward-dram-gb-per-s", value=920.1, unit="GB/s",
      quantity="DRAM bandwidth of llm.c's encoder_forward_kernel3 (GPT-2 training step), from Nsight Compute "
               "counters (DRAM bytes read and written over the kernel's duration, profile_gpt2cu.py)",
      hardware="one NVIDIA GeForce RTX 4090", software="llm.c profile_gpt2cu.py running ncu --set full (May 2024)",
      url="https://github.com/karpathy/llm.c/pull/377",
      title="karpathy/llm.c pull request #377, 'Add DRAM BW, Tensor Core Utilisation, & Efficiency Stats' (ademeure)",
      where="PR description, the profile table, row 00 (enc×1, encoder_forward_kernel3: 0.05 ms)",
      quote="encoder_forward_kernel3                      0.05    920.1", chapters=(16,),
      note="The Nsight Compute example of the chapter: a memory-bound kernel read off ncu's counters. The author "
           "warns the table 'was taken while optimising some of the kernels'; against the peak he states "
           "(ncu-rtx4090-dram-peak-gb-per-s) it is about nine tenths of the bandwidth."),
    F(key="ncu-rtx4090-dram-peak-gb-per-s", value=1008, unit="GB/s",
      quantity="theoretical peak DRAM bandwidth of the RTX 4090, as the llm.c profiling PR states it",
      hardware="NVIDIA GeForce RTX 4090", software="not applicable (a datasheet figure quoted in the PR)",
      url="https://github.com/karpathy/llm.c/pull/377",
      title="karpathy/llm.c pull request #377, 'Add DRAM BW, Tensor Core Utilisation, & Efficiency Stats' (ademeure)",
      where="PR description, paragraph before the profile table",
      quote="while the theoretical peak bandwidth is 1008GB/s, this is impossible to reach in practice",
      chapters=(16,),
      note="The PR's efficiency column divides by the highest bandwidth any kernel reached, not by this peak."),
    # XLA on TPUs: JAX (MaxText) and the TPU v4 paper
    F(key="maxtext-tpu-v5p-32b-mfu", value=71.47, unit="% MFU",
      quantity="model FLOPs utilization training a 32B-parameter LLM with MaxText (pure JAX, compiled by XLA)",
      hardware="Google Cloud TPU v5p-128", software="MaxText (JAX, XLA), commit cc7478e",
      url="https://github.com/google/maxtext/blob/cc7478e29dcf12d2f03d38d65d21d21f65380a60/README.md",
      title="MaxText (README)", where="Runtime Performance Results, TPU v5p table, row 32B",
      quote="| 32B | v5p-128 | 3.28e+02 | 71.47% |", chapters=(16,),
      note="The README: 'MaxText is pure Python, relying heavily on the XLA compiler to achieve high "
           "performance'. Compare with the GPU MFUs in the registry (PaLM, Megatron, llm.c) and the course's own."),
    F(key="tpu-v4-vs-a100-speedup", value=1.2, unit="x (low end of the stated 1.2x-1.7x)",
      quantity="speed of a TPU v4 system over an NVIDIA A100 system of similar size (the paper's comparison)",
      hardware="Google TPU v4 against NVIDIA A100, similar-sized systems", software="not stated in the abstract",
      url="https://arxiv.org/abs/2304.01433",
      title="TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning with Hardware Support for "
            "Embeddings (Jouppi et al., ISCA 2023; arXiv:2304.01433)",
      where="abstract (read as reproduced verbatim for arXiv 2304.01433v3 at https://pith.science/p/2304.01433)",
      quote="For similar sized systems, it is ~4.3x-4.5x faster than the Graphcore IPU Bow and is 1.2x-1.7x faster "
            "and uses 1.3x-1.9x less power than the Nvidia A100.", chapters=(16,),
      note="The vendor's own comparison of its chip with a GPU of the previous generation; the same sentence says "
           "1.3x-1.9x less power."),
    # FP8 and weight-only quantization
    F(key="gpt-fast-llama2-7b-int8-tokens-per-s", value=155.58, unit="tokens/s",
      quantity="decode speed of Llama-2-7B with int8 weight-only quantization, batch size 1",
      hardware=_GPT_FAST_A100, where="Benchmarks table, row 8-bit (Llama-2-7B)",
      quote="|           | 8-bit   | 155.58   | 1069.20 |",
      note="Against 104.9 tokens/s in bf16 (gpt-fast-llama2-7b-decode-tokens-per-s): half the bytes per weight, "
           "and decoding is bandwidth-bound, so fewer bytes means more tokens per second.", **_GPT_FAST),
    F(key="gpt-fast-llama2-7b-int4-tokens-per-s", value=196.80, unit="tokens/s",
      quantity="decode speed of Llama-2-7B with int4 weight-only quantization (group size 32), batch size 1",
      hardware=_GPT_FAST_A100, where="Benchmarks table, row 4-bit (G=32) (Llama-2-7B)",
      quote="|           | 4-bit (G=32)   | 196.80   | 862.69 |",
      note="Less than 4x the bf16 rate for a quarter of the bytes: the memory bandwidth reached falls (862.69 GB/s "
           "in the same row, against 1397.31 in bf16).", **_GPT_FAST),
    F(key="gpt-fast-llama2-7b-mi250x-tokens-per-s", value=76.33, unit="tokens/s",
      quantity="decode speed of Llama-2-7B in bf16 at batch size 1 on an AMD GPU (PyTorch ROCm build)",
      hardware="one GCD of an AMD Instinct MI250X", where="Benchmarks, AMD table, row Base (Llama-2-7B)",
      quote="| Llama-2-7B  | Base    |  76.33  | 1028.70 |",
      note="The same gpt-fast code (the README: 'Supports Nvidia and AMD GPUs') on a PyTorch ROCm build; "
           "compare with 104.9 tokens/s on the power-limited A100.",
      **_GPT_FAST),
    # post-training dynamic quantization on the CPU
    F(key="bert-dynamic-quant-fp32-size", value=438, unit="MB",
      quantity="size of the fine-tuned BERT-base (MRPC) state dict in float32", quote=_BERT_FP32_ROW,
      **_BERT_DYNAMIC_QUANT),
    F(key="bert-dynamic-quant-int8-size", value=181, unit="MB",
      quantity="size of the same model after dynamic int8 quantization of its nn.Linear layers",
      quote=_BERT_INT8_ROW,
      note="Not 4x smaller: the word embedding table (about 90 MB, the tutorial says) stays in float32.",
      **_BERT_DYNAMIC_QUANT),
    F(key="bert-dynamic-quant-fp32-eval-seconds", value=160, unit="s",
      quantity="time to evaluate the 408 MRPC examples in float32, 1 thread", quote=_BERT_FP32_ROW,
      **_BERT_DYNAMIC_QUANT),
    F(key="bert-dynamic-quant-int8-eval-seconds", value=90, unit="s",
      quantity="time to evaluate the 408 MRPC examples after dynamic int8 quantization, 1 thread",
      quote=_BERT_INT8_ROW,
      note="With 4 threads: 85 s (float32) and 46 s (int8), the same table says.", **_BERT_DYNAMIC_QUANT),
    F(key="bert-dynamic-quant-int8-f1", value=0.902, unit="F1 (MRPC)",
      quantity="F1 score on MRPC after dynamic int8 quantization (float32: 0.9019 in the same table)",
      quote=_BERT_INT8_ROW,
      note="The table shows the two F1 scores level (0.9019 and 0.902) while the tutorial's text says '0.6% lower "
           "F1 score accuracy'; the source disagrees with itself, so read it as 'quality about unchanged'.",
      **_BERT_DYNAMIC_QUANT),
    # knowledge distillation
    F(key="distilbert-size-reduction", value=40, unit="% smaller than BERT",
      quantity="size reduction of DistilBERT against BERT, by knowledge distillation during pre-training",
      **_DISTILBERT),
    F(key="distilbert-performance-retained", value=97, unit="% of BERT's language understanding",
      quantity="share of BERT's language-understanding capabilities DistilBERT keeps", **_DISTILBERT),
    F(key="distilbert-speedup", value=60, unit="% faster than BERT",
      quantity="speed of DistilBERT against BERT, as the abstract states it", **_DISTILBERT),
    # ONNX Runtime
    F(key="onnxruntime-bert-squad-latency-speedup", value=17, unit="x",
      quantity="BERT inference latency on SQuAD with Microsoft's transformer optimizations in ONNX Runtime",
      hardware="not named in the sentence (the article describes Azure CPU and GPU VMs)",
      software="ONNX Runtime (January 2020, with the open-sourced BERT optimizations)",
      url="https://www.infoq.com/news/2020/01/microsoft-bert-acceleration/",
      title="Microsoft Open-Sources ONNX Acceleration for BERT AI Model (InfoQ, January 2020)",
      where="first paragraph (a news report of Microsoft's blog post by Emma Ning et al.)",
      quote="With the optimizations, the model's inference latency on the SQUAD benchmark sped up 17x.",
      chapters=(16,),
      note="A secondary source reporting the vendor's figure; the sentence does not state the baseline. The "
           "optimizations fuse the self-attention, layer norm and GELU sub-graphs into single kernels (Microsoft's "
           "post of 2020-01-21, as quoted in press reports): fusion of the kind torch.compile does."),
)

# ---------------------------------------------------------------------------------------------------------------
# published measurements the step-time predictor (gpuformer_lib.predict) is validated against
_BUILD_NANOGPT = dict(
    hardware="one NVIDIA GPU of a Lambda GPU Cloud instance (the video description: 'The GPU I'm training the model "
             "on is from Lambda GPU Cloud'); the chapter titles do not name it: an A100 by this key's name, not "
             "confirmed in the text read",
    software="PyTorch (version not stated), build-nanogpt train_gpt2.py at the commit named in the note (June 2024)",
    url="https://classcentral.com/course/youtube-let-s-reproduce-gpt-2-124m-295231",
    title="Class Central listing of Andrej Karpathy's lecture 'Let's reproduce GPT-2 (124M)' (YouTube, June 2024), "
          "whose syllabus is the video's chapter list",
    where="Syllabus (the video's chapter titles); a secondary source: the same titles, with timestamps, are in "
          "copies of the YouTube description (e.g. https://moovly.ru/movies/"
          "Mi9CRlI5eHBSN0JNNVptOEJFRW9oVEZrVFI1RXpUNnkyeXEwcGZQK1crYz0: '01:22:18 SECTION 2: Let\u2019s make it "
          "fast. GPUs, mixed precision, 1000ms'); the build-nanogpt repository itself (README, commit messages) "
          "gives no timings",
    chapters=(10,))
_BUILD_NANOGPT_STEP = (
    "Secondary source: the chapter titles of the lecture as Class Central lists them, round readings of the dt the "
    "training loop prints; the primary (the YouTube video and its description) was not opened, and the "
    "build-nanogpt repository (https://github.com/karpathy/build-nanogpt) states no timings. Model, as written in "
    "build-nanogpt train_gpt2.py: GPT-2 124M, 12 layers, d_model 768, 12 heads (head dim 64), MLP 3072 (4 x 768, "
    "tanh-GELU), vocabulary 50257, context 1024, learned position embeddings, biases, LayerNorm before each "
    "sublayer, token embedding tied to the output projection, no dropout. Step: one GPU, B = 16 sequences x T = "
    "1024 = 16,384 tokens per step, no gradient accumulation, torch.optim.AdamW(lr=3e-4) (not fused), Tiny "
    "Shakespeare batches from DataLoaderLite. What is timed (time.time around the loop body): next_batch on the "
    "CPU, the host-to-device copy, zero_grad, forward + cross-entropy, backward and optimizer.step, ended by "
    "torch.cuda.synchronize(). ")
_DLE_TRANSFORMER_PERF = dict(
    software="pytorch-22.06-py3 NGC container; NVIDIA's fairseq-based train.py (scripts/run_DGX1_*.sh, "
             "scripts/run_DGXA100_*.sh)",
    url="https://github.com/NVIDIA/DeepLearningExamples/blob/729963dd47e7c8bd462ad10bfac7a7b0b604e6dd/PyTorch/"
        "Translation/Transformer/README.md",
    title="NVIDIA DeepLearningExamples: Transformer for PyTorch (README)", chapters=(10,))
_DLE_V100_WHERE = ("Results, Training performance results, 'Training performance: NVIDIA DGX-1 (8x V100 16GB)' table "
                   "(columns GPUs, Batch size / GPU, Throughput - FP32, Throughput - mixed precision, speedup, weak "
                   "scaling FP32, weak scaling mixed precision)")
_DLE_A100_WHERE = ("Results, Training performance results, 'Training performance: NVIDIA DGX A100 (8x A100 40GB)' "
                   "table (columns GPUs, Batch size / GPU, Throughput - TF32, Throughput - mixed precision, speedup, "
                   "weak scaling TF32, weak scaling mixed precision)")
_DLE_TRANSFORMER_STEP = (
    "Model (the scripts' --arch transformer_wmt_en_de_big_t2t --share-all-embeddings, fairseq/models/transformer.py): "
    "Transformer big, 6 encoder + 6 decoder layers, d_model 1024, 16 heads, FFN 4096 (ReLU), LayerNorm before each "
    "sublayer, sinusoidal positions, one embedding matrix shared by the encoder input, decoder input and output "
    "projection; joint BPE vocabulary of 33708 tokens plus special tokens (README); dropout 0.1, label-smoothed "
    "cross-entropy (0.1), Adam, fused layer norm (--fuse-layer-norm), eager PyTorch, no gradient accumulation "
    "(the scripts pass no --update-freq). WMT14 en-de sentences of varying length batched by a token budget: "
    "--max-tokens bounds each GPU's batch (padded sentences x the longest length). The README: 'Performance numbers "
    "(in tokens per second) were averaged over an entire training epoch': train.py's throughput meter counts each "
    "batch's 'ntokens' (the sum of target lengths, fairseq/data/data_utils.py) over the elapsed time, summed over "
    "the GPUs, so data loading, the optimizer and (on several GPUs) DDP's gradient all-reduce are inside it. ")
_LLMC = dict(
    software="llm.c train_gpt2cu (C/CUDA kernels, cuBLAS/cuBLASLt, cuDNN attention: the script builds with "
             "USE_CUDNN=1; bf16, the Makefile's default PRECISION), mpirun -np 8, mid-2024",
    where="the script's header comment, line 5 (an approximate figure written by the author)", chapters=(10,))
_LLMC_URL = "https://github.com/karpathy/llm.c/blob/f1e2ace651495b74ae22d45d1723443fd00ecd3a/scripts/"
_LLMC_STEP = (
    "Model from the -e \"dNN\" depth flag (train_gpt2.cu: d12 = 768 channels and 12 heads, d24 = 1024 and 16, d36 = "
    "1280 and 20, d48 = 1600 and 25), MLP 4 x d_model (GELU), vocabulary 50257 padded to 50304 inside llm.c, "
    "T = 1024, token embedding tied to the output projection. 8 GPUs, data parallel with ZeRO-1 (-z 1: optimizer "
    "state sharded), no activation recomputation (-r 0), AdamW. Timed: one optimizer step of -d tokens over all 8 "
    "GPUs, including its gradient-accumulation micro-steps and the gradient reduction, as the author states it in a "
    "comment (not a logged measurement); the comment does not say whether the periodic evaluation (-v 250, -h 1) "
    "is included. ")
_FA3_PAPER = dict(
    url="https://arxiv.org/abs/2407.08608",
    title="Shah, Bikshandi, Zhang, Thakkar, Ramani and Dao (2024), FlashAttention-3: Fast and Accurate Attention "
          "with Asynchrony and Low-precision (arXiv:2407.08608)", chapters=(10,))
_NCCL_2XA100 = dict(
    url="https://github.com/NVIDIA/nccl/issues/583",
    title="NVIDIA/nccl issue #583, 'AllReduce bandwidth change curve with respect to data size' (elevenxiang, "
          "2021-10-18)", chapters=(10,))
_A100_DATASHEET = dict(
    hardware="NVIDIA A100 80GB SXM (the datasheet's SXM4 column; the PCIe column has the same peaks)",
    software="not stated (a datasheet figure)",
    url="https://github.com/RSandAI/Efficient-YOLO-RS-Airplane-Detection/blob/"
        "d8228a315e81383aa6f640e6222c7a66285bcf27/2-Training/GPU/nvidia-a100-datasheet-nvidia-us-2188504-web.pdf",
    title="NVIDIA A100 Tensor Core GPU datasheet (NVIDIA, 2022, document 2188504)",
    chapters=(10,))
_A100_DATASHEET_WHERE = ("page 1, table 'NVIDIA A100 Tensor Core GPU Specifications, SXM4 and PCIe form factors' "
                         "(columns A100 80GB PCIe, A100 80GB SXM); NVIDIA's PDF, published at https://www.nvidia.com/"
                         "content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-nvidia-us-2188504-"
                         "web.pdf, read in the copy stored in the GitHub repository of the URL (text extracted from the "
                         "PDF; table cells joined with spaces)")
_AMPERE_WP = dict(
    software="not stated (a specification)",
    url="https://github.com/fmars/papers/blob/064468f8d8b5bde6118b410158621027fc4ed4c0/"
        "nvidia-ampere-architecture-whitepaper.pdf",
    title="NVIDIA A100 Tensor Core GPU Architecture (NVIDIA whitepaper V1.0, 2020)", chapters=(10,))
_AMPERE_WP_READ = (" NVIDIA's PDF (https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
                   "nvidia-ampere-architecture-whitepaper.pdf), read in the copy stored in the GitHub repository of "
                   "the URL (text extracted from the PDF)")
_AMPERE_WP_TABLE4 = ("Table 4, Comparison of NVIDIA Data Center GPUs (pp. 36-37; columns NVIDIA Tesla P100, Tesla "
                     "V100, A100; board form factors SXM, SXM2, SXM4); table cells joined with ' | ', footnote marks "
                     "dropped;" + _AMPERE_WP_READ)
_AMPERE_WP_TABLE2 = ("Table 2, A100 speedup over V100 (p. 23; columns V100, A100, A100 Sparsity, A100 Speedup, A100 "
                     "Speedup with Sparsity); table cells joined with ' | ';" + _AMPERE_WP_READ)

VALIDATION: tuple[F, ...] = (  # chapter 10: what the step-time predictor (gpuformer_lib.predict) is checked against
    # build-nanogpt's single-GPU speed ladder (GPT-2 124M, 16 x 1024 tokens a step)
    F(key="build-nanogpt-a100-fp32-step-ms", value=1000, unit="ms",
      quantity="training step time, GPT-2 124M, 16 x 1024 tokens, float32 (no TF32), eager",
      quote="SECTION 2: Let\u2019s make it fast. GPUs, mixed precision, 1000ms",
      note=_BUILD_NANOGPT_STEP + "This rung: float32 everywhere, matmuls included (TF32 off, PyTorch's default), "
           "eager; attention written out (q @ k^T, masked_fill, softmax, @ v: the 16 x 12 x 1024 x 1024 score "
           "matrix materialised). Code: commit 5265b2042aaaa84943313002671b8b3ca7749b06 without its "
           "torch.set_float32_matmul_precision('high') line (that commit set B = 16, T = 1024 and TF32 together).",
      **_BUILD_NANOGPT),
    F(key="build-nanogpt-a100-tf32-step-ms", value=333, unit="ms",
      quantity="training step time, GPT-2 124M, 16 x 1024 tokens, float32 with TF32 matmuls, eager",
      quote="Tensor Cores, timing the code, TF32 precision, 333ms",
      note=_BUILD_NANOGPT_STEP + "This rung: float32 tensors, matrix products on TF32 tensor cores "
           "(torch.set_float32_matmul_precision('high')), everything else float32; eager; attention written out. "
           "Code: commit 5265b2042aaaa84943313002671b8b3ca7749b06.",
      **_BUILD_NANOGPT),
    F(key="build-nanogpt-a100-bf16-step-ms", value=300, unit="ms",
      quantity="training step time, GPT-2 124M, 16 x 1024 tokens, bf16 autocast, eager",
      quote="float16, gradient scalers, bfloat16, 300ms",
      note=_BUILD_NANOGPT_STEP + "This rung: torch.autocast(device_type, dtype=torch.bfloat16) around forward and "
           "loss (matmuls in bf16; weights, gradients and AdamW state float32), TF32 still on, eager, attention "
           "written out. Code: commit 177e4cd5b4cc05df4bb637ed1a9e55911d6f1e2c.",
      **_BUILD_NANOGPT),
    F(key="build-nanogpt-a100-compile-step-ms", value=130, unit="ms",
      quantity="training step time, GPT-2 124M, 16 x 1024 tokens, bf16 autocast, torch.compile",
      quote="torch.compile, Python overhead, kernel fusion, 130ms",
      note=_BUILD_NANOGPT_STEP + "This rung: as the bf16 one plus model = torch.compile(model) (default mode); the "
           "attention is still the written-out one. A steady-state step: the compile time falls in the first steps. "
           "Code: commit fb8bd6efd1bd7c4c894c9256f3bf41420efd1cb2.",
      **_BUILD_NANOGPT),
    F(key="build-nanogpt-a100-flash-step-ms", value=96, unit="ms",
      quantity="training step time, GPT-2 124M, 16 x 1024 tokens, bf16 autocast, torch.compile, "
               "scaled_dot_product_attention",
      quote="flash attention, 96ms",
      note=_BUILD_NANOGPT_STEP + "This rung: as the compiled one with the attention replaced by "
           "F.scaled_dot_product_attention(q, k, v, is_causal=True) (FlashAttention kernels where the GPU has them); "
           "vocabulary still 50257. Code: commit 7ee630c8aa426cc9d22cff30c1b3480a24e016a1. The next chapters: "
           "vocabulary 50304, 93 ms; fused AdamW and the GPT-3 hyper-parameters, 90 ms.",
      **_BUILD_NANOGPT),
    # NVIDIA's reference Transformer big (WMT14 en-de): tokens per second over a training epoch
    F(key="nvidia-transformer-big-v100-fp32-tokens-per-s", value=8742, unit="tokens/s",
      quantity="training throughput, Transformer big, 1 GPU, float32, 2560 tokens per GPU",
      hardware="1 NVIDIA V100 16GB of a DGX-1 (SXM2)", where=_DLE_V100_WHERE,
      quote="| 1      | 5120/2560          | 8742                 | 32942",
      note=_DLE_TRANSFORMER_STEP + "This figure: 1 GPU, float32 on CUDA cores (no tensor cores), --max-tokens 2560 "
           "(scripts/run_DGX1_FP32.sh; the column's '5120/2560' is mixed precision / FP32).",
      **_DLE_TRANSFORMER_PERF),
    F(key="nvidia-transformer-big-v100-amp-tokens-per-s", value=32942, unit="tokens/s",
      quantity="training throughput, Transformer big, 1 GPU, mixed precision (fp16), 5120 tokens per GPU",
      hardware="1 NVIDIA V100 16GB of a DGX-1 (SXM2)", where=_DLE_V100_WHERE,
      quote="| 1      | 5120/2560          | 8742                 | 32942",
      note=_DLE_TRANSFORMER_STEP + "This figure: 1 GPU, mixed precision (--amp; the README's default AMP level is "
           "O2) on fp16 tensor cores, --max-tokens 5120 (scripts/run_DGX1_AMP.sh): twice the float32 batch, so the "
           "x3.77 of the row is not a same-batch speedup.",
      **_DLE_TRANSFORMER_PERF),
    F(key="nvidia-transformer-big-8xv100-amp-tokens-per-s", value=214656, unit="tokens/s (8 GPUs together)",
      quantity="training throughput, Transformer big, 8 GPUs data parallel, mixed precision, 5120 tokens per GPU",
      hardware="8 NVIDIA V100 16GB (SXM2) in a DGX-1 (NVLink)", where=_DLE_V100_WHERE,
      quote="| 8      | 5120/2560          | 59316                | 214656",
      note=_DLE_TRANSFORMER_STEP + "This figure: 8 GPUs (DDP, torch.distributed.run), mixed precision (--amp), "
           "--max-tokens 5120 per GPU; the row's weak scaling is 6.52 of 8 (float32: 59316 tokens/s, 6.79).",
      **_DLE_TRANSFORMER_PERF),
    F(key="nvidia-transformer-big-a100-tf32-tokens-per-s", value=51057, unit="tokens/s",
      quantity="training throughput, Transformer big, 1 GPU, TF32, 10240 tokens per GPU",
      hardware="1 NVIDIA A100 40GB of a DGX A100 (SXM4)", where=_DLE_A100_WHERE,
      quote="| 1      | 10240              | 51057                | 82059",
      note=_DLE_TRANSFORMER_STEP + "This figure: 1 GPU, TF32 as the README labels the column (the script "
           "scripts/run_DGXA100_TF32.sh sets no precision flag: float32 tensors, matmuls on TF32 tensor cores "
           "where the container enables it), --max-tokens 10240.",
      **_DLE_TRANSFORMER_PERF),
    F(key="nvidia-transformer-big-a100-amp-tokens-per-s", value=82059, unit="tokens/s",
      quantity="training throughput, Transformer big, 1 GPU, mixed precision (fp16), 10240 tokens per GPU",
      hardware="1 NVIDIA A100 40GB of a DGX A100 (SXM4)", where=_DLE_A100_WHERE,
      quote="| 1      | 10240              | 51057                | 82059",
      note=_DLE_TRANSFORMER_STEP + "This figure: 1 GPU, mixed precision (--amp), --max-tokens 10240 "
           "(scripts/run_DGXA100_AMP.sh), the same batch as the TF32 figure: x1.60 over TF32.",
      **_DLE_TRANSFORMER_PERF),
    F(key="nvidia-transformer-big-8xa100-amp-tokens-per-s", value=551599, unit="tokens/s (8 GPUs together)",
      quantity="training throughput, Transformer big, 8 GPUs data parallel, mixed precision, 10240 tokens per GPU",
      hardware="8 NVIDIA A100 40GB (SXM4) in a DGX A100 (NVLink, NVSwitch)", where=_DLE_A100_WHERE,
      quote="| 8      | 10240              | 347936               | 551599",
      note=_DLE_TRANSFORMER_STEP + "This figure: 8 GPUs (DDP), mixed precision (--amp), --max-tokens 10240 per "
           "GPU; the row's weak scaling is 6.72 of 8 (TF32: 347936 tokens/s, 6.81).",
      **_DLE_TRANSFORMER_PERF),
    # llm.c (C/CUDA) GPT-2 runs on one 8-GPU node, as the run scripts' comments give them
    F(key="llm-c-gpt2-124m-8xa100-step-ms", value=300, unit="ms",
      quantity="training step time, GPT-2 124M, 524,288 tokens a step over 8 GPUs, bf16, llm.c",
      hardware="8 NVIDIA A100 80GB SXM (one rented node, '$14/hr')", url=_LLMC_URL + "run_gpt2_124M.sh",
      title="karpathy/llm.c, scripts/run_gpt2_124M.sh (GPT-2 (124M) repro on FineWeb)",
      quote="# on 8X A100 80GB SXM ($14/hr) steps in ~300ms/iter",
      note=_LLMC_STEP + "This script: -e \"d12\" (12 layers, 768, 12 heads), -b 64 -t 1024 -d 524288: 64 x 1024 = "
           "65,536 tokens per GPU per step, no gradient accumulation; the comment goes on: 'training time 18,865 * "
           "300ms = 94.3 min'. llm-c-gpt2-124m-a100-mfu is the same run ('up to ~60%' MFU).",
      **_LLMC),
    F(key="llm-c-gpt2-350m-8xa100-step-ms", value=820, unit="ms",
      quantity="training step time, GPT-2 350M, 524,288 tokens a step over 8 GPUs, bf16, llm.c",
      hardware="8 NVIDIA A100 80GB SXM (one rented node, '$14/hr')", url=_LLMC_URL + "run_gpt2_350M.sh",
      title="karpathy/llm.c, scripts/run_gpt2_350M.sh (GPT-2 (350M) repro on FineWeb)",
      quote="# on 8X A100 80GB SXM ($14/hr) steps in ~820ms/iter",
      note=_LLMC_STEP + "This script: -e \"d24\" (24 layers, 1024, 16 heads), -b 64 -t 1024 -d 524288: 65,536 "
           "tokens per GPU per step, no gradient accumulation.",
      **_LLMC),
    F(key="llm-c-gpt2-774m-8xa100-step-s", value=1.7, unit="s",
      quantity="training step time, GPT-2 774M, 524,288 tokens a step over 8 GPUs, bf16, llm.c",
      hardware="8 NVIDIA A100 80GB SXM (one rented node, '$14/hr')", url=_LLMC_URL + "run_gpt2_774M.sh",
      title="karpathy/llm.c, scripts/run_gpt2_774M.sh (GPT-2 (774M) repro on FineWeb)",
      quote="# on 8X A100 80GB SXM ($14/hr) steps in ~1.7s/iter",
      note=_LLMC_STEP + "This script: -e \"d36\" (36 layers, 1280, 20 heads), -b 32 -t 1024 -d 524288: 2 "
           "micro-steps of 32 x 1024 tokens, 65,536 tokens per GPU per step.",
      **_LLMC),
    F(key="llm-c-gpt2-1558m-8xh100-step-s", value=2.8, unit="s",
      quantity="training step time, GPT-2 1558M, 1,048,576 tokens a step over 8 GPUs, bf16, llm.c",
      hardware="8 NVIDIA H100 80GB SXM (one rented node, '$28/hr')", url=_LLMC_URL + "run_gpt2_1558M.sh",
      title="karpathy/llm.c, scripts/run_gpt2_1558M.sh (GPT-2 (1558M) repro on FineWeb-EDU)",
      quote="# on 8X H100 80GB SXM ($28/hr) steps in 2.80s/iter",
      note=_LLMC_STEP + "This script: -e \"d48\" (48 layers, 1600, 25 heads), -b 16 -t 1024 -d 1048576: 8 "
           "micro-steps of 16 x 1024 tokens, 131,072 tokens per GPU per step; -ge 1 (GELU fused into the "
           "cuBLASLt matmul), cosine schedule. The next line of the same comment computes with 2.7 s: "
           "'32,000 steps * 2.7s => 24 hours'.",
      **_LLMC),
    # decoding at batch size 1 (gpt-fast)
    F(key="gpt-fast-llama2-7b-eager-tokens-per-s", value=25.5, unit="tok/s",
      quantity="decode speed of a 7B Llama at batch size 1, fp16 weights, eager PyTorch (the blog's starting point)",
      hardware="one NVIDIA A100-80GB, power-limited to 330 W",
      software="PyTorch nightly (late 2023), eager: no torch.compile, no static KV cache, no CUDA graphs",
      url="https://github.com/pytorch/pytorch.github.io/blob/d119d840c32c0f302ebff9a18042da05f72753bf/_posts/"
          "2023-11-30-accelerating-generative-ai-2.md",
      title="Team PyTorch (2023), Accelerating Generative AI with PyTorch II: GPT, Fast (the blog post's Markdown "
            "source; published at https://pytorch.org/blog/accelerating-generative-ai-2/)",
      where="section heading 'Starting Point (25.5 tok/s)'; the hardware from the note at the top ('Unless otherwise "
            "specified, all benchmarks are run on an A100-80GB, power limited to 330W')",
      quote="Starting Point (25.5 tok/s)", chapters=(10,),
      note="Batch size 1 ('We will be focusing on latency (i.e. batch size=1) for all of these benchmarks'); an "
           "'extremely basic and simple implementation' shown only as an image. The model: 'a 7B parameter model. "
           "Each parameter is stored in fp16' (the blog's MBU example; its conclusion says Llama-7B); gpt-fast's "
           "model.py config '7B' is 32 layers, d_model 4096, 32 heads, SwiGLU FFN 11008, vocabulary 32000. Prompt "
           "length and tokens generated are not stated for this figure. The blog finds it 'heavily CPU overhead "
           "bound', the GPU idle between kernels, so a bandwidth-only model predicts it several times too fast. "
           "With torch.compile(mode='reduce-overhead', fullgraph=True) and a static KV cache the same blog reaches "
           "107.0 tok/s (Step 1); the README's later table gives 104.9 (gpt-fast-llama2-7b-decode-tokens-per-s)."),
    F(key="gpt-fast-llama2-70b-tp8-tokens-per-s", value=62.5, unit="tokens/s",
      quantity="decode speed of Llama-2-70B at batch size 1, bf16, tensor parallel over 8 GPUs, torch.compile",
      hardware="8 NVIDIA A100-80GB, power-limited to 330 W, hybrid cube mesh topology",
      software="PyTorch nightly, gpt-fast generate.py + tp.py (torch.compile mode='reduce-overhead', "
               "ENABLE_INTRA_NODE_COMM=1 in the README's tensor-parallel command)",
      url="https://github.com/pytorch-labs/gpt-fast/blob/32971d3129541c5bfb4f715abc33d1c5f408d204/README.md",
      title="gpt-fast (README)", where="Benchmarks, Tensor Parallelism table, Llama-2-70B, row Number of GPUs 8 "
      "(columns Tokens/Second, Memory Bandwidth (GB/s))",
      quote="|           | 8   | 62.50   | 1135.29 |", chapters=(10,),
      note="The README: 'all benchmarks are run at *batch size=1* ... with a very small prompt length (just 5 "
           "tokens)'. Model (model.py config '70B'): 80 layers, d_model 8192, 64 query heads and 8 key/value heads "
           "(grouped-query), SwiGLU FFN 28672, vocabulary 32000, bf16 weights (about 140 GB, about 17.5 GB per GPU: derived). "
           "tp.py shards every linear layer over the 8 GPUs and all-reduces the output of each attention and each "
           "MLP (funcol.all_reduce): 2 all-reduces of one 8192-wide bf16 vector per layer per token, 160 per "
           "token (derived). Tokens/s: generated tokens over the wall time of the whole generate() call (5-token prefill "
           "included), averaged over samples after a compile warm-up (generate.py). Same table: 2 GPUs 21.32, 4 "
           "GPUs 38.01; the 1135.29 GB/s is the README's per-GPU memory bandwidth for this row."),
    # one attention kernel: FlashAttention-3 forward on an H100
    F(key="fa3-h100-fp16-forward-ms", value=3.538, unit="ms",
      quantity="time of one FlashAttention-3 forward, FP16, non-causal, {batch, seqlen, nheads, hdim} = "
               "{4, 8448, 16, 128}",
      hardware="one NVIDIA H100 80GB SXM5 (700 W), GPU clock fixed at 1830 MHz",
      software="FlashAttention-3 (CUTLASS 3.5), CUDA 12.3, PyTorch 2.3.0 (the paper's appendix C.1, May 2024)",
      where="section 4.2 Ablation Study, Table 2 'Pipelining ablation measurements', row FlashAttention-3 (columns "
            "Time, TFLOPs/s); read in an HTML rendering of the paper (ar5iv.labs.arxiv.org/html/2407.08608) "
            "converted to Markdown",
      quote="| FlashAttention-3 | 3.538 ms | 661 |",
      note="Section 4.2: 'We ablate both the 2-stage WGMMA-softmax pipelining and warp-specialization for "
           "non-causal FP16 FlashAttention-3 with fixed parameters {batch, seqlen, nheads, hdim} = {4, 8448, 16, "
           "128}.' The paper counts forward FLOPs as 4 x seqlen^2 x head dim x heads (per sequence): 4 x 8448^2 x "
           "128 x 16 x 4 = 2.34e12 FLOPs, / 3.538 ms = 661 TFLOPs/s, the table's other column (67 % of the 989 "
           "TFLOPS dense peak, h100-sxm-bf16-dense-peak). Appendix C.1: clock fixed at 1830 MHz (the clock of the "
           "989 TFLOPS figure), 'We repeat the benchmarks 100 times and take the average timing'. Same table: "
           "without GEMM-softmax pipelining 4.021 ms, without warp specialization 4.105 ms.",
      **_FA3_PAPER),
    # collectives on A100 nodes
    F(key="nccl-2xa100-allreduce-latency-us", value=10.14, unit="us",
      quantity="time of one all-reduce of 32 bytes (8 floats, sum) between 2 GPUs over NVLink, out-of-place",
      hardware="2 NVIDIA A100-SXM4-40GB of an 8-GPU A100 node",
      software="nccl-tests all_reduce_perf, one process driving both GPUs (nThread 1 nGpus 2), warm-up 5, 20 "
               "iterations; NCCL version not stated (October 2021)",
      where="issue description, the nccl-tests output, row size 32 B (columns size, count, type, redop, time, algbw, "
            "busbw, error, then the in-place ones)",
      quote="32             8     float     sum    10.14    0.00    0.00  0e+00    10.21",
      note="The smallest message of the sweep: the latency floor of one NCCL all-reduce call on 2 NVLink-connected "
           "A100s as nccl-tests times it (the average over 20 back-to-back calls, launch cost included, no CUDA "
           "graphs); in-place 10.21 us, and 64 B also takes 10.14 us. Compare nccl-nvlink-ring-step-latency (NCCL's "
           "model: 0.6 us per ring step with the LL protocol small messages use, 2 steps for 2 GPUs): most of the "
           "10 us is fixed per-call overhead, not the wire.",
      **_NCCL_2XA100),
    F(key="nccl-8xa100-allreduce-busbw-measured", value=232.54, unit="GB/s",
      quantity="all-reduce bus bandwidth at the largest message (4 GB), 8 GPUs in one node, measured",
      hardware="8 NVIDIA A100 in one node (form factor not stated; NVLink through NVSwitch, by the bandwidth)",
      software="NCCL and nccl-tests, versions not stated (October 2023)",
      url="https://github.com/NVIDIA/nccl-tests/issues/175",
      title="NVIDIA/nccl-tests issue #175, 'Two A100 nodes cannot reach ideal all-reduce performance'",
      where="issue description, scenario 2",
      quote="2. singleNode, ./build/all_reduce_perf -b 8 -e 4G -f 2 -g 8, result: 232.54GB/s", chapters=(10,),
      note="A logged run (one process driving 8 GPUs, sizes 8 B to 4 GB): the validation case for the predictor's "
           "NVLink ring bandwidth, rather than the NCCL developer's expected 230 GB/s of "
           "nccl-8xa100-allreduce-busbw. The same issue's two-node run reached 86 GB/s (network-bound)."),
    F(key="nccl-8xa100-allreduce-busbw", value=230, unit="GB/s",
      quantity="all-reduce bus bandwidth at large messages (8 GB), 8 GPUs in one node (an NCCL developer's expected "
               "value)",
      hardware="8 NVIDIA A100-SXM4-80GB in one HPE Apollo 6500, connected by NVLink",
      software="NCCL 2.18.1 (container) / 2.17.1 (host), nccl-tests all_reduce_perf",
      url="https://github.com/NVIDIA/nccl-tests/issues/149",
      title="NVIDIA/nccl-tests issue #149, 'Expected bandwidth results? A100 GPUs over NVLink' (answer by NCCL "
            "developer sjeaugey)",
      where="comment of 2023-07-05",
      quote="At 512M the bandwidth is still increasing, so you should replace `1G` by `8G`. That should reach 230 "
            "GB/s.", chapters=(10,),
      note="An expectation, not a logged run. The same comment: 'Each NVLink has a line rate of 25GB/s (in each "
           "direction) which converts to ~20GB/s effective bandwidth with a 128B payload size (*). The total "
           "effective bandwidth should therefore be 240GB/s on A100, but some other bottlenecks on the GPUs limits "
           "it to ~230GB/s.' The reporter had measured ~200 GB/s busbw with 1 GB at most. A measured one (opened): "
           "nccl-tests issue #175 (https://github.com/NVIDIA/nccl-tests/issues/175) reports 'singleNode, "
           "./build/all_reduce_perf -b 8 -e 4G -f 2 -g 8, result: 232.54GB/s' on an 8x A100 node. nccl-tests' "
           "busbw = algbw x 2(N - 1)/N, so 230 GB/s of busbw on 8 GPUs is about 131 GB/s of algbw (derived)."),
    # constants the predictor needs: measured matrix-product rates
    F(key="a100-sxm-bf16-mamf", value=271.2, unit="TFLOPS",
      quantity="measured BF16 matrix-product rate (maximum achievable matmul FLOPS, best shape of a search)",
      hardware="NVIDIA A100 SXM", software="torch 2.6.0+cu126",
      url="https://github.com/stas00/ml-engineering/blob/b9e29720eebd4aa946fa9678975385efbc90a777/compute/accelerator/README.md",
      title="Stas Bekman, Machine Learning Engineering Open Book: Accelerators",
      where="Maximum Achievable Matmul FLOPS comparison table, BF16 (columns MAMF, Theory, Efficiency, Best Shape "
            "MxNxK, torch ver)",
      quote="| NVIDIA A100 SXM  |  271.2 |    312 |      86.9% |   1024x10240x5120 | 2.6.0+cu126     |",
      chapters=(10,),
      note="The same table and method as h100-sxm-bf16-matmul-measured (794.5 on an H100 SXM): mean of 100 "
           "iterations after 50 warm-up ones, at the best shape of a brute-force search (mamf-finder.py); 86.9 % "
           "of the 312 TFLOPS dense peak (a100-bf16-dense-peak). The book warns the numbers are 'a rough "
           "estimation'; a square product of one size reaches less."),
    F(key="v100-fp16-matmul-measured", value=95, unit="TFLOPS",
      quantity="measured FP16 matrix-product rate, square n x n, best of n = 128, 512, 2048, 8192 (not a shape "
               "search)",
      hardware="NVIDIA V100 16GB (form factor not stated)",
      software="PyTorch, torch.utils.benchmark (versions of the V100 run not stated; the README recommends the NGC "
               "PyTorch container, e.g. 22.07)",
      url="https://github.com/mli/transformers-benchmarks/blob/04df81d067b5dc22ac920942e9dab9d739d81ddc/README.md",
      title="Mu Li, Transformers Benchmarks (README)",
      where="Micro-Benchmarking Summary table, row 'MatMul FP32 / FP16', column V100 16GB (the third of A100 80GB, "
            "A6000, V100 16GB, 3090 Ti)",
      quote="| MatMul FP32 / FP16        | 116 / 230 | 60 / 95  |  14 / 95  | 42 / 81  |", chapters=(10,),
      note="No V100 row in the MAMF table (a100-sxm-bf16-mamf); this is the nearest measured rate found. "
           "micro_bench.ipynb times 'a @ b' on two n x n fp16 matrices, FLOPs = 2 n^3 over the median of a >= 3 s "
           "torch.utils.benchmark blocked_autorange, and the table keeps the best size: 76 % of the 125 TFLOPS "
           "tensor-core peak (v100-sxm2-fp16-tensor-peak). Same cell: FP32 14 TFLOPS. '95' is also the A6000's "
           "FP16 figure in the same row; the V100 is the third column."),
    # datasheet peaks of the GPUs the validation cases ran on
    F(key="a100-bf16-dense-peak", value=312, unit="TFLOPS", quantity="dense BF16 Tensor Core peak (no sparsity)",
      where=_A100_DATASHEET_WHERE, quote="BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*",
      note="624 is the figure with 2:4 structured sparsity ('* With sparsity'); dense is 312. The whitepaper's "
           "Table 1 gives the same for the 40 GB A100 (peaks at the 1410 MHz boost clock). FP16 tensor cores: also "
           "312.", **_A100_DATASHEET),
    F(key="a100-tf32-dense-peak", value=156, unit="TFLOPS", quantity="dense TF32 Tensor Core peak (no sparsity)",
      where=_A100_DATASHEET_WHERE, quote="Tensor Float 32 (TF32) 156 TFLOPS | 312 TFLOPS*",
      note="The roof of float32 matrix products when PyTorch allows TF32 (torch.set_float32_matmul_precision("
           "'high')); 312 is with sparsity.", **_A100_DATASHEET),
    F(key="a100-fp32-peak", value=19.5, unit="TFLOPS", quantity="float32 peak on CUDA cores (no tensor cores)",
      where=_A100_DATASHEET_WHERE, quote="FP32 19.5 TFLOPS",
      note="The roof of float32 matrix products with TF32 off, and of element-wise float32 arithmetic.",
      **_A100_DATASHEET),
    F(key="a100-80gb-hbm-bandwidth", value=2039, unit="GB/s", quantity="HBM2e memory bandwidth (datasheet peak)",
      where=_A100_DATASHEET_WHERE, quote="GPU Memory Bandwidth 1,935GB/s 2,039GB/s",
      note="2,039 GB/s is the SXM column; the A100 80GB PCIe has 1,935 GB/s. The 40 GB A100 has 1555 GB/s "
           "(a100-40gb-hbm-bandwidth). gpt-fast's README measured about 1700 GB/s at most on a 330 W-limited "
           "A100-80GB.", **_A100_DATASHEET),
    F(key="a100-40gb-hbm-bandwidth", value=1555, unit="GB/s", quantity="HBM2 memory bandwidth (peak)",
      hardware="NVIDIA A100 40GB (SXM4)",
      where="section '40 GB HBM2 and 40 MB L2 Cache' (p. 16);" + _AMPERE_WP_READ,
      quote="the NVIDIA A100 GPU has 40 GB of high-speed HBM2 memory with a class-leading 1555 GB/sec of memory "
            "bandwidth",
      note="The A100 of DGX A100 (8x A100 40GB), e.g. NVIDIA's Transformer tables above; 1215 MHz DDR over five "
           "HBM2 stacks (p. 35). Table 4 gives the same 1555 GB/sec.", **_AMPERE_WP),
    F(key="a100-nvlink-bandwidth", value=600, unit="GB/sec", quantity="NVLink 3 bandwidth per GPU, both directions "
      "summed (12 links)", hardware="NVIDIA A100 (SXM4)",
      where="section 'Third-Generation NVLink' (p. 52; also p. 17);" + _AMPERE_WP_READ,
      quote="yielding a whopping 600 GB/sec total bandwidth for an entire A100 versus 300 GB/sec for Tesla V100.",
      note="The same page: 'A single link provides 25 GB/second bandwidth in each direction', so 12 x 25 = 300 GB/s "
           "each way; the registry's nvlink4-unidirectional-bandwidth (450, H100) counts one direction. The A100 "
           "datasheet prints 'NVLink: 600GB/s'. NCCL reaches about 230 GB/s of all-reduce busbw on 8 A100s "
           "(nccl-8xa100-allreduce-busbw).", **_AMPERE_WP),
    F(key="v100-nvlink-bandwidth", value=300, unit="GB/sec", quantity="NVLink 2 bandwidth per GPU, both directions "
      "summed (6 links)", hardware="NVIDIA Tesla V100 (SXM2)",
      where="section 'Third-Generation NVLink' (p. 52; also p. 17);" + _AMPERE_WP_READ,
      quote="yielding a whopping 600 GB/sec total bandwidth for an entire A100 versus 300 GB/sec for Tesla V100.",
      note="Six links of 25 GB/s each way: 150 GB/s in each direction. DGX-1 joins its 8 V100s by NVLink in a "
           "hybrid cube mesh, not a switch.", **_AMPERE_WP),
    F(key="v100-sxm2-fp16-tensor-peak", value=125, unit="TFLOPS", quantity="FP16 Tensor Core peak (dense)",
      hardware="NVIDIA Tesla V100 (SXM2, 1530 MHz boost)", where=_AMPERE_WP_TABLE2,
      quote="A100 FP16 TC vs V100 FP16 TC | 125 TFLOPS | 312 TFLOPS | 624 TFLOPS | 2.5x | 5x",
      note="Table 4 of the same whitepaper gives 125 for the V100's 'Peak FP16 Tensor TFLOPS with FP32 Accumulate' "
           "too. The V100 has no bf16 and no TF32: float32 matrix products run on CUDA cores "
           "(v100-sxm2-fp32-peak).", **_AMPERE_WP),
    F(key="v100-sxm2-fp32-peak", value=15.7, unit="TFLOPS", quantity="float32 peak on CUDA cores",
      hardware="NVIDIA Tesla V100 (SXM2, 1530 MHz boost)", where=_AMPERE_WP_TABLE2,
      quote="A100 FP32 vs V100 FP32 | 15.7 TFLOPS | 19.5 TFLOPS | NA | 1.25x | NA",
      note="Table 4 gives the same 15.7 for the Tesla V100 (SXM2) column. The roof of NVIDIA's float32 "
           "Transformer figure (nvidia-transformer-big-v100-fp32-tokens-per-s).", **_AMPERE_WP),
    F(key="v100-hbm-bandwidth", value=900, unit="GB/sec", quantity="HBM2 memory bandwidth (peak)",
      hardware="NVIDIA Tesla V100 (SXM2; 16 GB or 32 GB)", where=_AMPERE_WP_TABLE4,
      quote="Memory Bandwidth | 720 GB/sec | 900 GB/sec | 1555 GB/sec",
      note="The middle column is the Tesla V100 (SXM2, 877.5 MHz DDR HBM2, 4096-bit).", **_AMPERE_WP),
    F(key="p100-sxm2-fp32-peak", value=10.6, unit="TFLOPS", quantity="float32 peak (non-Tensor; the P100 has no "
      "tensor cores)", hardware="NVIDIA Tesla P100 (the table's 'SXM' board, 1480 MHz boost)",
      where=_AMPERE_WP_TABLE4, quote="Peak FP32 TFLOPS (non-Tensor) | 10.6 | 15.7 | 19.5",
      note="The GPU of Vaswani et al.'s step times (transformer-base-step-time-8xp100, transformer-big-step-time-"
           "8xp100); the paper says 'P100' without the form factor, and the table's P100 is the SXM-module "
           "one (the key says sxm2 as the course named it).", **_AMPERE_WP),
    F(key="p100-sxm2-fp16-peak", value=21.2, unit="TFLOPS", quantity="FP16 peak (non-Tensor: packed half2 on CUDA "
      "cores)", hardware="NVIDIA Tesla P100 (the table's 'SXM' board, 1480 MHz boost)", where=_AMPERE_WP_TABLE4,
      quote="Peak FP16 TFLOPS (non-Tensor) | 21.2 | 31.4 | 78",
      note="Twice the float32 rate, through half2 instructions; no tensor cores. Vaswani et al. do not state the "
           "precision of their P100 runs.", **_AMPERE_WP),
    F(key="p100-sxm2-hbm-bandwidth", value=720, unit="GB/sec", quantity="HBM2 memory bandwidth (peak)",
      hardware="NVIDIA Tesla P100 (the table's 'SXM' board, 16 GB, 703 MHz DDR)", where=_AMPERE_WP_TABLE4,
      quote="Memory Bandwidth | 720 GB/sec | 900 GB/sec | 1555 GB/sec",
      note="NVIDIA's whitepaper gives 720 GB/sec; the P100 product pages and datasheets, as restated in many "
           "secondary copies, give 732 GB/s ('16GB CoWoS HBM2 at 732 GB/s'); no NVIDIA P100 datasheet was opened "
           "here, so the registry holds the whitepaper's 720 (2 % apart).", **_AMPERE_WP),
)


FIGURES: tuple[dict, ...] = (SETUP + HARDWARE + KERNELS + ATTENTION + HEADS + MODEL + OPTIMIZERS
                          + TRAINING + PRECISION + MEMORY + PROFILING + DATA_PARALLEL + MODEL_PARALLEL
                          + CASE_TRANSLATION + PROTEINS + FORECASTING + TOOLS + VALIDATION)
