"""Chapter 03 · The memory equation: exercises.

Fill in each function, then run `infer-lab check 03`. GB = 1e9 bytes, GiB = 2**30 bytes.
Llama-3.1-70B's config (Llama-3-70B's shape, with a 131,072-token context): 80 layers, 64 query heads, 8 KV heads, head dim 128
(`infer-lab kv --model llama-3.1-70b` prints more).
"""


def kv_gb_70b_128k() -> float:
    """Predict the KV cache of ONE sequence of 128k tokens (128 x 1024) on Llama-3.1-70B, in GB.

    The cache is bf16 (2 bytes per value). Work it out from the config above and return the
    number (a float, in GB = 1e9 bytes).
    """
    raise NotImplementedError


def mla_kv_bytes_per_token(layers: int, kv_lora_rank: int, qk_rope_head_dim: int,
                           bytes_per_value: int) -> int:
    """KV bytes per token, all layers, of a Multi-head Latent Attention (MLA) model (DeepSeek).

    Per layer and per token, MLA caches one compressed latent of ``kv_lora_rank`` values and
    one RoPE key of ``qk_rope_head_dim`` values shared by all heads; K and V of each head are
    rebuilt from the latent when attention runs.
    """
    raise NotImplementedError


def quantized_bytes(n_weights: int, bits: int, group_size: int | None, scale_bits: int) -> int:
    """Bytes of ``n_weights`` weights stored in ``bits`` bits each, plus one scale per group.

    Every group of ``group_size`` consecutive weights shares one scale of ``scale_bits`` bits
    (the last group may be shorter); ``group_size`` None means no scales (bf16, fp8). Round
    the total up to whole bytes.
    """
    raise NotImplementedError


def max_users(usable_bytes: int, weight_bytes: int, overhead_bytes: int, kv_bytes_per_user: int) -> int:
    """How many users fit: whole users whose KV cache fits next to the weights and the overhead.

    ``usable_bytes`` is the part of GPU memory the server may use; ``overhead_bytes`` the
    runtime's reserve and activation workspace; ``kv_bytes_per_user`` one user's full KV cache.
    """
    raise NotImplementedError
