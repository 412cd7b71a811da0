"""Bad inputs to the library's tensor and size functions fail with a clear error, never a wrong number (issue 14).

Each probe is a mistake a careless learner makes: float token ids, an empty prompt, a NaN temperature, a
float where a count belongs, a string where a dtype belongs, scores where attention weights belong. Every
probe here gave, before the checks were added, one of

    S  a silent wrong answer: a number, a tensor or a plot came back, and it was wrong
       (e.g. transformer_flops(config, -2, 5) = -151680; training_memory(n, n_layers=-2) had negative
       activations; bleu("我喜欢茶", "我喜欢酒") scored characters as sentences; sample(..., n_new=-1)
       returned the prompt);
    R  a raw traceback from inside torch, Triton, sacrebleu or Python that does not say what to do
       (e.g. "probability tensor contains either inf, nan or element < 0" for temperature=nan,
       "index -1 is out of bounds" for an empty prompt, "max() arg is an empty sequence");
    N  a valid-looking answer to a call that makes no sense, now refused (an empty sequence; float64 into a
       kernel that computes in float32).

Now each raises a ValueError or TypeError whose message names the argument and the value and says what
to do; the first letter of each probe's id is what it was before, the phrase is a key part of the message.

Counts over the whole audit (196 probes; these are the 114 that now raise):

    before:  60 silent   57 raw   62 clear   17 fine
    after:    0 silent    3 raw  176 clear   17 fine

The 3 raw ones are left on purpose: an id out of range with ``check_token_ids=False`` (the lookup fails,
IndexError or a device-side assert: the price of no host sync), a bad device string (torch's own message
lists the valid ones) and ``bench.operator_category(None)``. Four former S/R probes now give the right
answer instead of an error: see the tests at the end.

A second sweep over the public functions (losses, memory, config flags, the vocabulary, the schedule)
found more silent cases; the probes after "a second sweep" below and the last tests are those.
"""

import math

import numpy as np
import pytest
import torch

from gpuformer_lib import attention, bench, data, device_measurements as dm, generate, kernels, losses, memory, model
from gpuformer_lib import model_sizes, profiles, speed, train
from gpuformer_lib.device import SizePreset
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32,
                           dropout=0.0, max_len=12)
torch.manual_seed(0)
LM, TR = DecoderLM(CONFIG), Transformer(CONFIG)
IDS = torch.randint(0, 20, (2, 5))
MEMORY = TR.encode(IDS).detach()
EMPTY = torch.zeros(2, 0, dtype=torch.long)
CPU, H100X8 = profiles.PROFILES["cpu"], profiles.PROFILES["8xh100"]
needs_triton = pytest.mark.skipif(kernels.kernel_support().triton_mode == "unavailable",
                                  reason="Triton is not installed")
KDEV = "cuda" if kernels.kernel_support().triton_mode == "compiled" else "cpu"


def config(**changes):
    return TransformerConfig(**{**dict(vocab_size=20, d_model=16, n_heads=2, d_ff=32, max_len=12), **changes})


def meta_lm():
    with torch.device("meta"):
        return DecoderLM(CONFIG)


def sizes(**changes):
    """training_memory's activation arguments, with ``changes``."""
    return {**dict(n_layers=2, d_model=16, n_heads=2, seq_len=8, batch_size=2, vocab_size=20), **changes}


# a masked loss's inputs: logits (2, 5, 7), targets (2, 5), padding True at the last two positions of row 1
LOGITS = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(1))
TARGETS = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(2))
PADDING = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
X4, W6, B6 = torch.randn(4, 3), torch.randn(6, 3), torch.randn(6)
T4 = torch.tensor([0, 5, 2, 3])
QKV = tuple(torch.randn(1, 2, 4, 8) for _ in range(3))


def probe(before, call, error, phrase, id):
    return pytest.param(call, error, phrase, id=f"{before} {id}")


PROBES = [
    # ------------------------------------------------------------------ model
    probe("S", lambda: TR(EMPTY, IDS), ValueError, "at least one token", "model: empty source: decoder ignored it"),
    probe("N", lambda: LM(EMPTY), ValueError, "at least one token", "model: DecoderLM on (B, 0)"),
    probe("N", lambda: TR(IDS, EMPTY), ValueError, "at least one token", "model: empty target"),
    probe("R", lambda: TR.decode(IDS, MEMORY.double()), ValueError, "model computes in torch.float32",
          "model: decode float64 memory"),
    probe("R", lambda: TR.decode(IDS, MEMORY.long()), ValueError, "memory is torch.int64", "model: decode int memory"),
    probe("S", lambda: TR.decode(IDS, MEMORY, torch.ones(2, 5)), ValueError, "must be a bool tensor",
          "model: decode float source mask: used as numbers"),
    probe("S", lambda: meta_lm()(IDS), ValueError, "token ids are on cpu but the model is on meta",
          "model: ids on another device: empty meta logits"),
    probe("R", lambda: LM(IDS, padding_mask=torch.zeros(2, 5, dtype=torch.bool, device="meta")), ValueError,
          "padding_mask is on meta", "model: padding mask on another device"),
    probe("R", lambda: TR.decode(IDS, MEMORY.to("meta")), ValueError, "memory is on meta",
          "model: memory on another device"),
    probe("S", lambda: config(vocab_size=True), ValueError, "vocab_size must be a positive int",
          "config: vocab_size=True became 1"),
    probe("R", lambda: config(src_vocab_size=7.5), ValueError, "src_vocab_size must be a positive int",
          "config: float src_vocab_size"),
    probe("R", lambda: config(n_encoder_layers=2.0), ValueError, "layer counts must be ints",
          "config: float n_encoder_layers"),
    probe("R", lambda: config(n_decoder_layers=1.5), ValueError, "layer counts must be ints",
          "config: float n_decoder_layers"),
    probe("R", lambda: config(dropout="0.1"), ValueError, "dropout must be a number", "config: dropout string"),
    probe("S", lambda: model.transformer_flops(CONFIG, -2, 5), ValueError, "batch_size must be an int >= 1",
          "flops: negative batch: negative FLOPs"),
    probe("S", lambda: model.transformer_flops(CONFIG, 0, 5), ValueError, "batch_size must be an int >= 1",
          "flops: batch 0"),
    probe("S", lambda: model.transformer_flops(CONFIG, 2, 0), ValueError, "tgt_len must be an int >= 1",
          "flops: tgt_len 0"),
    probe("S", lambda: model.transformer_flops(CONFIG, 2, 5.5), ValueError, "tgt_len must be an int",
          "flops: float tgt_len: float FLOPs"),
    probe("S", lambda: model.transformer_flops(CONFIG, 2, 5, src_len=-3), ValueError, "src_len must be an int >= 0",
          "flops: negative src_len"),
    probe("R", lambda: model.count_parameters(IDS), TypeError, "needs an nn.Module", "count_parameters: a tensor"),
    # ------------------------------------------------------------------ generation
    probe("R", lambda: generate.sample(LM, IDS, 2, temperature=math.nan), ValueError, "temperature must be positive",
          "sample: NaN temperature"),
    probe("S", lambda: generate.sample(LM, IDS, 2, temperature=math.inf), ValueError, "and finite",
          "sample: infinite temperature: uniform draws"),
    probe("R", lambda: generate.sample(LM, IDS, 2, top_k=0), ValueError, "top_k must be None", "sample: top_k 0"),
    probe("R", lambda: generate.sample(LM, IDS, 2, top_k=-1), ValueError, "top_k must be None",
          "sample: negative top_k"),
    probe("R", lambda: generate.sample(LM, IDS, 2, top_k=2.5), ValueError, "top_k must be None", "sample: float top_k"),
    probe("S", lambda: generate.sample(LM, IDS, -1), ValueError, "n_new", "sample: negative n_new: the prompt back"),
    probe("R", lambda: generate.sample(LM, IDS, 2.0), ValueError, "n_new", "sample: float n_new"),
    probe("R", lambda: generate.sample(LM, EMPTY, 2), ValueError, "T >= 1", "sample: empty prompt"),
    probe("R", lambda: generate.sample(LM, IDS[0], 2), ValueError, r"prompt\[None\]", "sample: (T,) prompt"),
    probe("R", lambda: generate.sample(TR, IDS, 2), TypeError, "greedy_translate", "sample: encoder-decoder model"),
    probe("S", lambda: generate.greedy_translate(TR, IDS, max_len=0), ValueError, "max_len must be an int >= 2",
          "greedy: max_len 0: empty translations"),
    probe("S", lambda: generate.greedy_translate(TR, IDS, max_len=1), ValueError, "max_len must be an int >= 2",
          "greedy: max_len 1: empty translations"),
    probe("R", lambda: generate.greedy_translate(TR, IDS, max_len=5.5), ValueError, "max_len must be an int",
          "greedy: float max_len"),
    probe("R", lambda: generate.greedy_translate(LM, IDS), TypeError, "needs an encoder-decoder",
          "greedy: decoder-only model"),
    probe("S", lambda: generate.greedy_translate(TR, EMPTY), ValueError, "at least one token",
          "greedy: empty source: 10 tokens out of nothing"),
    probe("S", lambda: generate.bleu("我喜欢茶", "我喜欢酒"), TypeError, "list of sentences",
          "bleu: strings: characters scored as sentences"),
    probe("R", lambda: generate.bleu([[1, 2, 3]], [[1, 2, 3]]), TypeError, "decode token ids to text",
          "bleu: token-id lists"),
    probe("R", lambda: generate.bleu(["a b"], ["a b"], tokenize="klingon"), ValueError, "not one of sacrebleu's",
          "bleu: unknown tokenizer"),
    probe("S", lambda: generate.perplexity(-1.0), ValueError, "number >= 0", "perplexity: negative loss"),
    probe("S", lambda: generate.perplexity(math.nan), ValueError, "training diverged", "perplexity: NaN loss"),
    probe("R", lambda: generate.perplexity(torch.tensor([1.0, 2.0])), ValueError, r"take \.mean\(\) first",
          "perplexity: per-token losses"),
    # ------------------------------------------------------------------ memory
    probe("S", lambda: memory.training_memory(10**6, param_bytes=0), ValueError, "param_bytes must be an int >= 1",
          "memory: param_bytes 0"),
    probe("S", lambda: memory.training_memory(10**6, param_bytes=2.5), ValueError, "param_bytes must be an int",
          "memory: float param_bytes"),
    probe("S", lambda: memory.training_memory(1.5e6), ValueError, "write 1_500_000", "memory: n_params 1.5e6"),
    probe("S", lambda: memory.training_memory(1.5), ValueError, "n_params must be an int", "memory: n_params 1.5"),
    probe("S", lambda: memory.training_memory(10, **sizes(n_layers=-2)), ValueError, "n_layers must be an int >= 0",
          "memory: negative n_layers: negative activations"),
    probe("S", lambda: memory.training_memory(10, **sizes(n_layers=1.5)), ValueError, "n_layers must be an int",
          "memory: float n_layers"),
    probe("S", lambda: memory.training_memory(10, **sizes(vocab_size=0)), ValueError, "vocab_size",
          "memory: no vocab_size: the largest tensor left out"),
    probe("S", lambda: memory.training_memory(10, **sizes(seq_len=8.5)), ValueError, "seq_len",
          "memory: float seq_len"),
    probe("S", lambda: memory.training_memory(10, **sizes(d_model=18, n_heads=4)), ValueError, "not divisible",
          "memory: d_model not divisible by n_heads"),
    probe("S", lambda: memory.training_memory(10, **sizes(), activation_bytes=0), ValueError, "activation_bytes",
          "memory: activation_bytes 0"),
    probe("S", lambda: memory.training_memory(10, **sizes(), d_ff=0), ValueError, "d_ff must be an int >= 1",
          "memory: d_ff 0"),
    probe("S", lambda: memory.training_memory(10**6, shard_weights=2.5), ValueError, "shard_weights must be an int",
          "memory: float shard count"),
    probe("S", lambda: memory.training_memory(10**6, count_loss_temporaries=True), ValueError,
          "count_loss_temporaries", "memory: loss temporaries of no batch: 0"),
    probe("S", lambda: memory.training_memory(10**6, grad_bytes=-2), ValueError, "grad_bytes must be an int >= 1",
          "memory: negative grad_bytes"),
    probe("S", lambda: memory.layer_activation_bytes(d_model=0, n_heads=1, seq_len=0, batch_size=0), ValueError,
          "d_model must be an int >= 1", "memory: layer of zero sizes: 0 bytes"),
    probe("S", lambda: memory.layer_activation_bytes(d_model=16, n_heads=2, seq_len=-8, batch_size=2), ValueError,
          "seq_len must be an int >= 1", "memory: layer of negative length"),
    probe("S", lambda: memory.SavedActivations(cap=-1), ValueError, "cap", "memory: negative cap"),
    probe("S", lambda: memory.SavedActivations(cap=1.5), ValueError, "cap", "memory: cap 1.5 (GiB meant)"),
    probe("S", lambda: memory.fit_micro_batch(lambda micro: None, 7.5), ValueError, "batch_size must be an int",
          "memory: fit_micro_batch float batch: (7.5, 1.0)"),
    probe("R", lambda: memory.choose_memory_cap(CPU, "cpu", lambda: None, 1000, margin=math.nan), ValueError,
          "margin must be a finite number", "memory: NaN margin"),
    probe("R", lambda: memory.model_state_bytes(IDS), TypeError, "needs an nn.Module", "memory: model_state_bytes"),
    # ------------------------------------------------------------------ bench
    probe("R", lambda: bench.time_fn(lambda: None, warmup=1.5), ValueError, "warmup must be an int",
          "bench: float warmup"),
    probe("R", lambda: bench.time_fn(3), TypeError, "wrap the work in a lambda", "bench: time_fn(value)"),
    probe("S", lambda: bench.speedup(math.nan, 1.0), ValueError, "times must be positive", "bench: NaN speedup"),
    probe("S", lambda: bench.matmul_flops(-4, 4, 4), ValueError, "m must be an int >= 0",
          "bench: negative matmul size"),
    probe("S", lambda: bench.matmul_flops(4.5, 4, 4), ValueError, "m must be an int", "bench: float matmul size"),
    probe("S", lambda: bench.measure_matmul(0, torch.float32, "cpu", repeats=1), ValueError, "n must be an int >= 1",
          "bench: measure_matmul n 0: 0 FLOP/s"),
    probe("R", lambda: bench.measure_matmul(-2, torch.float32, "cpu", repeats=1), ValueError, "n must be an int",
          "bench: measure_matmul n negative"),
    probe("R", lambda: bench.measure_matmul(8, torch.int32, "cpu", repeats=1), ValueError, "floating-point",
          "bench: measure_matmul int32"),
    probe("R", lambda: bench.measure_matmul(8, "float16", "cpu", repeats=1), ValueError, "torch.dtype",
          "bench: measure_matmul dtype string"),
    probe("S", lambda: bench.measure_copy_bandwidth(0, "cpu", repeats=1), ValueError, "nbytes must be an int >= 1",
          "bench: copy of 0 bytes: 0 B/s"),
    probe("R", lambda: bench.measure_copy_bandwidth(1e3, "cpu", repeats=1), ValueError, "nbytes must be an int",
          "bench: float nbytes"),
    probe("R", lambda: bench.lookup_gpu_peak(None), TypeError, "GPU's name as a string", "bench: no GPU name"),
    probe("S", lambda: bench.attainable_flops(math.nan, 1e12, 1e9), ValueError, "intensity must be a finite",
          "bench: NaN intensity: the peak"),
    probe("R", lambda: bench.ridge_intensity(1e12, 0), ValueError, "bandwidth must be a finite number > 0",
          "bench: ridge at 0 bandwidth"),
    probe("S", lambda: bench.ridge_intensity(-1e12, 1e9), ValueError, "peak_flops must be a finite number > 0",
          "bench: negative ridge"),
    probe("S", lambda: bench.mfu(-1e12, 1.0, 1e12), ValueError, "flops_per_step", "bench: negative MFU"),
    probe("S", lambda: bench.mfu(1e12, math.nan, 1e12), ValueError, "seconds_per_step", "bench: NaN MFU"),
    probe("R", lambda: bench.Timing(times=(), warmup=0, number=1), ValueError, "at least one measured time",
          "bench: empty Timing"),
    # ------------------------------------------------------------------ device measurements, sizes, profiles
    probe("S", lambda: dm.is_emulated("float16", "cpu"), TypeError, "torch.dtype", "dm: is_emulated('float16')"),
    probe("S", lambda: dm.MatmulFormat("x", "float16"), TypeError, "torch.dtype", "dm: MatmulFormat dtype string"),
    probe("S", lambda: dm.KernelRate("k", 1.0, 10.5), ValueError, "int nbytes", "dm: KernelRate of 10.5 bytes"),
    probe("R", lambda: dm.readback_cost(lambda: torch.ones(()), "cpu", steps=2.5), ValueError, "need ints",
          "dm: float steps"),
    probe("R", lambda: dm.readback_cost(lambda: 1.0, "cpu", steps=2, warmup=0), TypeError, "return loss, not",
          "dm: step returns a float"),
    probe("S", lambda: model_sizes.RunSize(CONFIG, 2.5, 8, 10, 1e-3), ValueError, "batch_size must be an int",
          "sizes: float batch"),
    probe("S", lambda: model_sizes.RunSize(CONFIG, 2, 8, 10.5, 1e-3), ValueError, "steps must be an int",
          "sizes: float steps"),
    probe("R", lambda: model_sizes.RunSize({"max_len": 12}, 2, 8, 10, 1e-3), TypeError, "TransformerConfig",
          "sizes: a dict for the config"),
    probe("R", lambda: model_sizes.translation_run("cpu", 10, 10), TypeError, "must be a SizePreset",
          "sizes: a preset name"),
    probe("R", lambda: profiles.data_parallel_world(H100X8, 2.5), ValueError, "global_batch must be an int",
          "profiles: float batch"),
    probe("S", lambda: profiles.collective_backend(H100X8, 1.5), ValueError, "processes must be an int",
          "profiles: 1.5 processes: nccl"),
    probe("R", lambda: profiles.DeviceProfile("x", "cuda", gpu_count=1, memory_gib=16.0, compute_capability=(8,)),
          ValueError, "compute_capability must be", "profiles: compute capability (8,)"),
    probe("S", lambda: profiles.DeviceProfile("x", "cuda", gpu_count=1, memory_gib=-1.0, compute_capability=(8, 0)),
          ValueError, "memory_gib must be", "profiles: negative memory"),
    probe("S", lambda: profiles.DeviceProfile("x", "cuda", gpu_count=1.5, memory_gib=16.0, compute_capability=(8, 0)),
          ValueError, "gpu_count must be", "profiles: 1.5 GPUs"),
    probe("R", lambda: profiles.training_precision("t4"), TypeError, "must be a DeviceProfile",
          "profiles: a profile name"),
    # a second sweep, after the first was fixed: the silent cases it found
    probe("S", lambda: losses.masked_cross_entropy(LOGITS, TARGETS, (~PADDING).long()), TypeError,
          "attention_mask == 0", "losses: a 0/1 mask that is 1 at real tokens: inverted"),
    probe("S", lambda: losses.masked_cross_entropy(LOGITS, TARGETS, PADDING, label_smoothing=math.nan), ValueError,
          "label_smoothing must be", "losses: label_smoothing=nan ignored"),
    probe("S", lambda: losses.masked_cross_entropy(LOGITS, TARGETS, PADDING, label_smoothing=-0.1), ValueError,
          "label_smoothing must be", "losses: negative label_smoothing ignored"),
    probe("S", lambda: losses.linear_softmax_cross_entropy(X4, W6, B6, T4[:2]), ValueError, "must be \\(N, C\\)",
          "losses: too few targets: mean of the first rows"),
    probe("S", lambda: losses.linear_softmax_cross_entropy(X4, W6, B6, T4[:, None]), ValueError, "must be \\(N, C\\)",
          "losses: (N, 1) targets: an (N, N) broadcast"),
    probe("S", lambda: losses.linear_softmax_cross_entropy(X4, W6, B6[:1], T4), ValueError, "must be \\(N, C\\)",
          "losses: a bias of one value broadcast"),
    probe("S", lambda: losses.linear_softmax_cross_entropy(X4, W6, B6, torch.tensor([-1, 0, 1, 2])), ValueError,
          "must lie in \\[0, 6\\)", "losses: -1 taken as the last class"),
    probe("S", lambda: memory.training_memory(10**6, d_model=768, n_heads=12, seq_len=1024, batch_size=8,
                                              vocab_size=50304), ValueError, "only with n_layers",
          "memory: batch sizes without n_layers: 0 activations"),
    probe("S", lambda: memory.training_memory(10, master_weights=True), ValueError, "float32 already",
          "memory: master copies of float32 weights"),
    probe("S", lambda: memory.training_memory(10, **sizes(autocast="no")), TypeError, "autocast must be True or False",
          "memory: autocast='no' counted as True"),
    probe("S", lambda: model.transformer_flops(CONFIG, 2, 5, training="no"), TypeError, "training must be True",
          "model: training='no': 3x the FLOPs"),
    probe("S", lambda: config(norm_first="False"), TypeError, "norm_first must be True or False",
          "model: norm_first='False' builds pre-LN"),
    probe("S", lambda: config(fused_attention="no"), TypeError, "fused_attention must be True or False",
          "model: fused_attention='no' is fused"),
    probe("S", lambda: speed.SpeedPlan(checkpointing="no"), TypeError, "checkpointing must be True or False",
          "speed: checkpointing='no' checkpoints"),
    probe("S", lambda: train.TrainConfig(progress="no"), TypeError, "progress must be True or False",
          "train: progress='no' shows the bar"),
    probe("S", lambda: train.parameter_groups(LM, math.nan), ValueError, "weight_decay must be",
          "train: NaN weight decay: NaN weights after a step"),
    probe("S", lambda: train.parameter_groups(LM, -0.1), ValueError, "weight_decay must be",
          "train: negative weight decay"),
    probe("S", lambda: train.lr_multiplier(train.TrainConfig(max_steps=10, warmup_steps=2))(-3), ValueError,
          "starts at step 0", "train: a negative step: a negative lr"),
    probe("S", lambda: data.Vocab.build(["the cat sat"], data.english_words).encode("the cat"), TypeError,
          "list of tokens", "data: a string to a word vocabulary: every character <unk>"),
    probe("S", lambda: data.Vocab.build("the cat sat", data.english_words), TypeError, "not one string",
          "data: one string as the texts: a character vocabulary"),
    probe("S", lambda: data.Vocab.build(["a b b"], str.split, max_size=-1), ValueError, "max_size must be",
          "data: max_size=-1 drops the last token"),
    probe("S", lambda: data.Vocab.build(["a b b"], str.split, min_freq=5), ValueError, "lower min_freq",
          "data: min_freq filters out every token: only the specials"),
    probe("S", lambda: TR.decode(IDS, torch.zeros(2, 0, 16)), ValueError, "no source positions",
          "model: decoding from an empty memory: the source ignored"),
    probe("S", lambda: generate.perplexity(True), ValueError, "a cross-entropy loss is a number",
          "generate: perplexity(True) = e"),
    probe("S", lambda: data.padding_fraction([[0, 1]], [-5, 2]), ValueError, "lengths must be ints >= 0",
          "data: a negative length: a padding fraction of 1.75"),
    probe("S", lambda: data.padding_fraction([[0, -1]], [3, 2]), ValueError, "indices must be ints in",
          "data: a negative index wraps around"),
    probe("S", lambda: attention.scaled_dot_product_attention(*QKV, scale=math.nan), ValueError, "scale must be",
          "attention: scale=nan: NaN output"),
    probe("S", lambda: attention.scaled_dot_product_attention(*QKV, scale=-1.0), ValueError, "scale must be",
          "attention: negative scale inverts the attention"),
]


@pytest.mark.parametrize("call, error, phrase", PROBES)
def test_a_bad_input_gets_a_clear_error(call, error, phrase):
    with pytest.raises(error, match=phrase):
        call()


KERNEL_PROBES = [
    probe("S", lambda: kernels.softmax(torch.randint(0, 5, (3, 4), device=KDEV)), ValueError, "takes float16",
          "kernels: softmax of ints: truncated to 0"),
    probe("R", lambda: kernels.softmax(torch.randn(3, 0, device=KDEV)), ValueError, "no columns",
          "kernels: softmax of empty rows"),
    probe("R", lambda: kernels.vector_add(torch.ones(5, device=KDEV), torch.ones(5, device=KDEV), block_size=100),
          ValueError, "power of two", "kernels: block 100"),
    probe("R", lambda: kernels.vector_add(torch.ones(5, device=KDEV), torch.ones(5, device=KDEV), block_size=0),
          ValueError, "power of two", "kernels: block 0"),
    probe("R", lambda: kernels.strided_copy(torch.randn(10, device=KDEV), 2.5), ValueError, "int stride",
          "kernels: float stride"),
    probe("R", lambda: kernels.strided_copy(torch.randn(10, device=KDEV), 1, block_size=100), ValueError,
          "power of two", "kernels: strided_copy block 100"),
    probe("R", lambda: kernels.matmul(torch.ones(16, 16, dtype=torch.long, device=KDEV),
                                      torch.ones(16, 16, dtype=torch.long, device=KDEV)),
          ValueError, "takes float16", "kernels: matmul of ints"),
    probe("N", lambda: kernels.matmul(torch.randn(16, 16, dtype=torch.float64, device=KDEV),
                                      torch.randn(16, 16, dtype=torch.float64, device=KDEV)),
          ValueError, "computes in float32", "kernels: float64 matmul"),
    probe("R", lambda: kernels.matmul(torch.randn(16, 16, device=KDEV), torch.randn(16, 16, device=KDEV),
                                      block_m=32.0), ValueError, "power of two", "kernels: float block"),
    probe("N", lambda: kernels.matmul(torch.randn(16, 16, device=KDEV), torch.randn(16, 16, device=KDEV),
                                      num_warps=0), ValueError, "num_warps", "kernels: 0 warps"),
]


@needs_triton
@pytest.mark.parametrize("call, error, phrase", KERNEL_PROBES)
def test_a_bad_kernel_input_gets_a_clear_error(call, error, phrase):
    with pytest.raises(error, match=phrase):
        call()


@pytest.mark.parametrize("call, phrase", [
    (lambda: kernels.cuda_add(torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)), "float32 only"),
    (lambda: kernels.cuda_add(torch.ones(3), torch.ones(3), threads=2048), "threads must be an int from 1 to 1024"),
    (lambda: kernels.cuda_add(torch.ones(3), torch.ones(3), blocks=0), "blocks must be an int"),
])
def test_cuda_add_checks_its_arguments_before_the_machine(call, phrase):
    """R on a GPU (a TORCH_CHECK 'float32 only' without advice, a failed launch), and on a machine without one
    only the 'cannot be compiled here' error: the arguments are now checked first, the same everywhere."""
    with pytest.raises(ValueError, match=phrase):
        call()


VIZ_PROBES = [
    probe("R", lambda viz: viz.plot_roofline(1e12, 1e9, [("a", 1.0)]), ValueError, "each point is",
          "viz: a point without its FLOP/s"),
    probe("S", lambda viz: viz.plot_roofline(1e12, 1e9, [("a", 0.0, 1e9)]), ValueError, "FLOP/byte > 0",
          "viz: a point at intensity 0: not drawn"),
    probe("S", lambda viz: viz.plot_roofline(math.nan, 1e9), ValueError, "positive and finite",
          "viz: NaN peak: an empty plot"),
    probe("R", lambda viz: viz.plot_roofline(1e12, 1e9, extra_ceilings=[(2e12,)]), ValueError, "each extra ceiling",
          "viz: a ceiling without its label"),
    probe("S", lambda viz: viz.attention_heatmap(5 * torch.randn(3, 3), list("abc"), list("abc")), ValueError,
          "before the softmax", "viz: scores plotted as weights: colours clipped"),
    probe("R", lambda viz: viz.attention_explorer(torch.rand(3, 3), list("abc"), list("abc")), ValueError,
          r"\(H, Tq, Tk\)", "viz: explorer of one head"),
    probe("R", lambda viz: viz.attention_explorer(torch.rand(1, 2, 3, 3), list("abc"), list("abc")), ValueError,
          r"weights\[0\]", "viz: explorer of a batch"),
    probe("R", lambda viz: viz.memory_report_html({"weights": 1}), TypeError, "must be a TrainingMemory",
          "viz: a dict for the memory"),
    probe("S", lambda viz: viz.memory_report_html(memory.training_memory(10**6), gpu_gib=-3), ValueError,
          "gpu_gib must be", "viz: a GPU of -3 GiB"),
]


@pytest.mark.parametrize("call, error, phrase", VIZ_PROBES)
def test_a_bad_plot_input_gets_a_clear_error(call, error, phrase):
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    import matplotlib

    matplotlib.use("Agg")
    from gpuformer_lib import viz

    with pytest.raises(error, match=phrase):
        call(viz)


# ---------------------------------------------------------------------- former S/R probes that now compute


@needs_triton
def test_softmax_of_a_transposed_input_is_right():
    """S: the kernel stepped through a row one element at a time whatever the column stride, so x.t() gave
    numbers off by up to 1e9; now such an input is copied first."""
    x = torch.randn(16, 8, device=KDEV)
    for view in (x.t(), x[:, ::2]):
        torch.testing.assert_close(kernels.softmax(view), view.softmax(-1))


def test_perplexity_of_a_huge_loss_is_infinite():
    """R: math.exp(1000) raised OverflowError."""
    assert generate.perplexity(1000.0) == math.inf
    assert generate.perplexity(torch.tensor(math.log(50))) == pytest.approx(50)


def test_a_negative_duration_is_formatted_with_its_sign():
    """S: format_seconds(-0.001) gave '-1e+06 ns'."""
    assert bench.format_seconds(-1e-3) == "-1 ms"
    assert bench.format_seconds(2.5e-6) == "2.5 µs"


def test_attention_heatmap_takes_a_numpy_array():
    """R: a NumPy array failed with "'numpy.ndarray' object has no attribute 'detach'"."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuformer_lib import viz

    weights = torch.rand(3, 4).softmax(-1)
    ax = viz.attention_heatmap(weights.numpy(), list("abc"), list("wxyz"))
    np.testing.assert_allclose(ax.images[0].get_array(), weights.numpy())
    plt.close(ax.figure)


def test_the_size_checks_accept_numpy_integers_and_leave_good_calls_alone():
    """The checks reject floats and bools, not NumPy's ints (a sweep over np.arange passes those)."""
    assert model.transformer_flops(CONFIG, np.int64(2), np.int64(5)) == model.transformer_flops(CONFIG, 2, 5)
    assert memory.training_memory(np.int64(10**6)).total == 16 * 10**6
    assert generate.sample(LM, IDS, 3, top_k=100).shape == (2, 8)  # top_k beyond V keeps every token
    assert model_sizes.char_lm_run(SizePreset("cpu", "test"), 65).batch_size >= 1


def test_ignore_index_targets_count_as_padding():
    """PyTorch's -100 in the targets: those positions were in the mean's denominator (a loss too small)."""
    reference = torch.nn.functional.cross_entropy(LOGITS.flatten(0, 1), TARGETS.masked_fill(PADDING, -100).flatten())
    got = losses.masked_cross_entropy(LOGITS, TARGETS.masked_fill(PADDING, -100), torch.zeros_like(PADDING))
    torch.testing.assert_close(got, reference)
    torch.testing.assert_close(got, losses.masked_cross_entropy(LOGITS, TARGETS, PADDING))


def test_numpy_int32_sizes_do_not_wrap_around():
    """NumPy's int32 passed the size checks, and the products then wrapped around (7e12 FLOPs became 5e8)."""
    config_ = model.gpt2_config()
    assert model.transformer_flops(config_, np.int32(8), np.int32(1024)) == model.transformer_flops(config_, 8, 1024)
    assert memory.training_memory(np.int32(10**9)).total == 16 * 10**9
    assert bench.matmul_flops(*[np.int32(4096)] * 3) == 2 * 4096**3
    assert memory.layer_activation_bytes(d_model=np.int32(4096), n_heads=np.int32(32), seq_len=np.int32(8192),
                                         batch_size=np.int32(64)) == \
        memory.layer_activation_bytes(d_model=4096, n_heads=32, seq_len=8192, batch_size=64)


def test_a_character_vocabulary_still_encodes_a_string():
    chars = data.Vocab(sorted(set("hello")))
    assert chars.encode("hello") == chars.encode(list("hello"))


def test_warmup_longer_than_the_run_is_said():
    with pytest.warns(UserWarning, match="never reaches"):
        train.TrainConfig(max_steps=5, warmup_steps=100)
