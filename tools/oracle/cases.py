"""The oracle's tiny models: one transformers config per case (see README.md for why each exists).

Every K dimension of a linear layer (hidden, q_lora, kv_lora, heads * v_head_dim, intermediate
sizes) is a multiple of 16, so `fp4moe quantize` can quantize every linear to NVFP4.
"""

# Shared by every case: the MLA / MoE structure at toy size.
COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,        # dense MLP (layer 0)
    moe_intermediate_size=32,
    first_k_dense_replace=1,      # layer 0 dense, layers 1.. MoE
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)

# The GLM-5 (GlmMoeDsaForCausalLM) cases: GLM-5's structure at toy size.
GLM_BASE = dict(
    COMMON,
    num_hidden_layers=4,
    q_lora_rank=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_group=4,                    # grouped top-k: 4 groups of 4 experts, best 2 groups kept
    topk_group=2,
    index_n_heads=16,             # 16 indexer heads: index scores rarely tie
    index_head_dim=32,            # rope part (16) is the HEAD of an indexer head
    rms_norm_eps=1e-5,
    max_position_embeddings=1024,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)

CASES = {
    "glm5-tiny-sparse": dict(
        arch="GlmMoeDsaForCausalLM",
        about="GLM-5 with DSA index_topk 16 < the 64-token prompt: sparse selection on every full layer "
              "from query 17 on; every layer runs its own indexer; grouped top-k routing (n_group 4, topk_group 2)",
        config=dict(GLM_BASE, index_topk=16),
        seed=1201,
    ),
    "glm5-tiny-dense": dict(
        arch="GlmMoeDsaForCausalLM",
        about="GLM-5 with index_topk 128 >= P+N: the indexer selects every causal key, i.e. plain causal "
              "attention; 8 experts top-2 without groups; 3 layers",
        config=dict(GLM_BASE, num_hidden_layers=3, index_topk=128, n_routed_experts=8, num_experts_per_tok=2,
                    n_group=1, topk_group=1),
        seed=1202,
    ),
    "glm5-tiny-shared": dict(
        arch="GlmMoeDsaForCausalLM",
        about="GLM-5 with index_topk 16 and indexer_types [full, shared, shared, full] (derived by transformers "
              "from index_topk_freq 3, index_skip_topk_offset 1): layers 1 and 2 reuse layer 0's top-k and have "
              "no indexer weights; n_group 2, topk_group 1",
        config=dict(GLM_BASE, index_topk=16, index_topk_freq=3, index_skip_topk_offset=1, n_group=2, topk_group=1),
        seed=1203,
    ),
    "deepseek-v3-tiny-yarn": dict(
        arch="DeepseekV3ForCausalLM",
        about="DeepSeek-V3 (no indexer) with q_lora_rank null (q_proj), YaRN rope (factor 40, mscale 1.0, "
              "mscale_all_dim 0.707: cos/sin scaled by mscale(1.0)/mscale(0.707) and the softmax scale by "
              "mscale(0.707)^2), interleaved rope; 8 experts top-2, n_group 2, topk_group 1; 3 layers",
        config=dict(
            COMMON,
            num_hidden_layers=3,
            q_lora_rank=None,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            rms_norm_eps=1e-6,
            max_position_embeddings=163840,
            rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                             "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1},
        ),
        seed=1204,
    ),
}
