"""ModelConfig: the architecture facts a model needs, whichever file format they came from."""

from __future__ import annotations

from dataclasses import dataclass, field

# HF "architectures" names and GGUF "general.architecture" values we run, by family.
DENSE_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
               "Qwen3ForCausalLM": "qwen3"}
MOE_ARCHS = {"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"}
MLA_ARCHS = {"DeepseekV2ForCausalLM": "deepseek_v2",  # multi-head latent attention + DeepSeek MoE
             "DeepseekV3ForCausalLM": "deepseek_v3"}
SUPPORTED_ARCHS = {**DENSE_ARCHS, **MOE_ARCHS, **MLA_ARCHS}


@dataclass
class ModelConfig:
    """Llama-style decoder facts. ``arch`` is one of the values of SUPPORTED_ARCHS."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", ...} as in HF configs
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    # MoE (zero experts = dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's gated shared expert
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    # DeepSeek MoE: router scores (V3: sigmoid, plus a per-expert bias for the choice; V2: softmax), top-k within
    # the best topk_group of n_group expert groups, weights scaled by routed_scaling_factor; dense MLPs below
    # first_k_dense_replace
    router_scoring: str = "sigmoid"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    # MLA (kv_lora_rank > 0): queries through a rank-q_lora_rank bottleneck (0: one projection), keys and values
    # from one cached latent of kv_lora_rank channels plus a shared rotary key of qk_rope_head_dim channels
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False  # rotary pairs (x0, x1), (x2, x3), ... rather than the two halves
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def rotary_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def kv_cache_layout(self) -> tuple[int, int, int]:
        """(tensors per layer, heads, channels) of the KV cache: a key and a value cache of the KV heads, or MLA's
        one latent cache (kv_lora_rank + qk_rope_head_dim channels, shared by every head)."""
        if self.is_mla:
            return 1, 1, self.kv_lora_rank + self.qk_rope_head_dim
        return 2, self.num_kv_heads, self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, i: int) -> bool:
        return (self.is_moe and i not in self.mlp_only_layers and i >= self.first_k_dense_replace
                and (i + 1) % max(self.decoder_sparse_step, 1) == 0)
