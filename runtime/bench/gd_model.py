"""gpu_decode.py's target model stand-in (``TinyLM``; SGLang's model classes
import ``sgl_kernel`` layers) and its config."""

from __future__ import annotations

import types

import torch

from gd_common import SGL

# ---------------------------------------------------------------------------
# the model (stand-in target: SGLang's model classes need sgl_kernel)
# ---------------------------------------------------------------------------


class TinyConfig:
    """What TritonAttnBackend / ForwardBatch read from ``model_config`` (the
    fields of the kit's TinyModelConfig)."""

    def __init__(self, V, H, heads, kv_heads, head_dim, context_len):
        self.attention_arch = SGL.AttentionArch.MHA
        self.context_len = context_len
        self.hidden_size = H
        self.vocab_size = V
        self.dtype = torch.float32
        self.num_attention_heads = heads
        self.num_key_value_heads = kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim
        self.swa_v_head_dim = head_dim
        self.is_encoder_decoder = False
        self.is_multimodal = False
        self.model_is_mrope = False
        self.is_generation = True
        self.quantization = None
        self.is_hybrid_swa = False
        self.is_local_attention_model = False
        self.attention_chunk_size = None
        self.sliding_window_size = None
        self.hf_config = types.SimpleNamespace(architectures=["TinyForCausalLM"], hidden_size=H,
                                               num_attention_heads=heads, num_key_value_heads=kv_heads,
                                               head_dim=head_dim, vocab_size=V)
        self.hf_config.get_text_config = lambda: self.hf_config
        self.hf_text_config = self.hf_config
        self.linear_attn_registry_result = None
        self.requires_mm_token_modalities = False  # ForwardBatch.init_new
        self.is_matryoshka = False
        self.spec_hidden_size = H  # eagle_utils (the drafter's hidden width: the target's here)

    def get_num_attention_heads(self, tp_size):
        return self.num_attention_heads // tp_size

    def get_max_num_attention_heads(self):
        return self.num_attention_heads

    def get_num_kv_heads(self, tp_size, dcp_size=1):
        return self.num_key_value_heads // (tp_size // dcp_size)


class TinyLM(torch.nn.Module):
    """Llama-like random-weight target: RMSNorm, RoPE, RadixAttention (SGLang's,
    through the forward context's backend), SwiGLU MLP; fp32.  ``lm_head`` (what
    the DDTree head reads: ``model.lm_head.weight``) is a bf16 copy of the
    output projection, as a served bf16 model's head is."""

    def __init__(self, V, H, layers, heads, head_dim, seed, device, logit_scale=3.0):
        super().__init__()
        g = torch.Generator(device="cpu").manual_seed(seed)

        def w(*shape, s=1.0):
            return torch.nn.Parameter((torch.randn(*shape, generator=g) * s).to(device), requires_grad=False)

        self.V, self.H, self.nl, self.nh, self.hd = V, H, layers, heads, head_dim
        self.embed = w(V, H)
        self.layers = []
        for i in range(layers):
            lay = types.SimpleNamespace(
                wqkv=w(3 * heads * head_dim, H, s=H ** -0.5), wo=w(H, heads * head_dim, s=(heads * head_dim) ** -0.5),
                w1=w(2 * H, H, s=H ** -0.5), w2=w(H, H, s=H ** -0.5),
                attn=SGL.RadixAttention(num_heads=heads, head_dim=head_dim, scaling=head_dim ** -0.5,
                                        num_kv_heads=heads, layer_id=i))
            self.layers.append(lay)
        self.out = w(V, H, s=logit_scale * H ** -0.5)
        self.lm_head = types.SimpleNamespace(weight=self.out.detach().to(torch.bfloat16))
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.inv_freq = inv.to(device)

    def get_input_embeddings(self):
        return lambda ids: torch.nn.functional.embedding(ids, self.embed)

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def _rope(self, x, pos):  # x [T, h, d]
        f = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        c, s = f.cos()[:, None, :], f.sin()[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)

    def forward(self, input_ids, positions, fb):
        T = int(input_ids.shape[0])
        x = torch.nn.functional.embedding(input_ids, self.embed)
        for lay in self.layers:
            q, k, v = (self._norm(x) @ lay.wqkv.T).view(T, 3, self.nh, self.hd).unbind(1)
            q, k = self._rope(q, positions), self._rope(k, positions)
            a = lay.attn(q.reshape(T, -1).contiguous(), k.reshape(T, -1).contiguous(), v.reshape(T, -1).contiguous(), fb)
            x = x + a.view(T, -1) @ lay.wo.T
            h = self._norm(x) @ lay.w1.T
            g_, u = h.chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(g_) * u) @ lay.w2.T
        hidden = self._norm(x)
        return hidden @ self.out.T, hidden
