"""A plain PyTorch FLUX.1 transformer with flowtrain's built-in text encoder in front: the
comparison peer for flowtrain's C++ models (models/flux/flux.cpp, models/text/).

Written from the structure of black-forest-labs/flux (src/flux/model.py, modules/layers.py,
math.py); module and parameter names follow the reference, so the reference's checkpoints,
flowtrain's exports and the `model.transformer.*` tensors of a flowtrain parity dump load with
`load_state_dict`:

    img_in, txt_in                              Linear
    time_in / vector_in / guidance_in           MLPEmbedder: in_layer -> SiLU -> out_layer
    double_blocks.N.{img,txt}_mod.lin           Linear(D, 6D) on SiLU(vec)
    double_blocks.N.{img,txt}_attn.qkv          Linear(D, 3D), heads split as [B, L, 3, H, Dh]
    double_blocks.N.{img,txt}_attn.norm.{query,key}_norm.scale   RMSNorm (fp32, eps 1e-6)
    double_blocks.N.{img,txt}_attn.proj         Linear(D, D)
    double_blocks.N.{img,txt}_mlp.{0,2}         Linear -> GELU(tanh) -> Linear
    single_blocks.N.{linear1,linear2}           D -> 3D + M; D + M -> D
    single_blocks.N.norm.{query,key}_norm.scale, single_blocks.N.modulation.lin (3 chunks)
    final_layer.{linear,adaLN_modulation.1}     shift, scale

flowtrain's text encoder (models/text/text_encoder.h) keeps flowtrain's names under
`text_encoder.`: token_embedding, position_embedding, layers.N.{norm1,qkv,proj,norm2,fc1,fc2},
final_norm, pooled_proj.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def timestep_embedding(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0,
                       time_factor: float = 1000.0) -> torch.Tensor:
    """The reference's sinusoidal features of t [B] in [0, 1] (scaled by time_factor), cos first."""
    t = time_factor * t
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(t.dtype if t.is_floating_point() else torch.float32)


def rope(pos: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """[B, L] positions -> [B, L, dim/2, 2, 2] rotation matrices (the reference's math.rope)."""
    scale = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim
    omega = 1.0 / (theta ** scale)
    out = torch.einsum("...n,d->...nd", pos.double(), omega)
    out = torch.stack([torch.cos(out), -torch.sin(out), torch.sin(out), torch.cos(out)], dim=-1)
    return out.view(*out.shape[:-1], 2, 2).float()


def embed_nd(ids: torch.Tensor, axes_dim: list[int], theta: float) -> torch.Tensor:
    """ids [B, L, n_axes] -> pe [B, 1, L, head_dim/2, 2, 2] (the reference's EmbedND)."""
    emb = torch.cat([rope(ids[..., i], axes_dim[i], theta) for i in range(len(axes_dim))], dim=-3)
    return emb.unsqueeze(1)


def apply_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    xq_ = xq.float().reshape(*xq.shape[:-1], -1, 1, 2)
    xk_ = xk.float().reshape(*xk.shape[:-1], -1, 1, 2)
    xq_out = freqs_cis[..., 0] * xq_[..., 0] + freqs_cis[..., 1] * xq_[..., 1]
    xk_out = freqs_cis[..., 0] * xk_[..., 0] + freqs_cis[..., 1] * xk_[..., 1]
    return xq_out.reshape(*xq.shape).type_as(xq), xk_out.reshape(*xk.shape).type_as(xk)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    q, k = apply_rope(q, k, pe)
    x = F.scaled_dot_product_attention(q, k, v)  # [B, H, L, D]
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden_dim: int):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim, bias=True)
        self.silu = nn.SiLU()
        self.out_layer = nn.Linear(hidden_dim, hidden_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(self.silu(self.in_layer(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_dtype = x.dtype
        x = x.float()
        rrms = torch.rsqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6)
        return (x * rrms).to(dtype=x_dtype) * self.scale


class QKNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)

    def forward(self, q, k, v):
        return self.query_norm(q).to(v), self.key_norm(k).to(v)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.norm = QKNorm(dim // num_heads)
        self.proj = nn.Linear(dim, dim)


class Modulation(nn.Module):
    def __init__(self, dim: int, double: bool):
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim, bias=True)

    def forward(self, vec: torch.Tensor):
        return self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)


def split_qkv(qkv: torch.Tensor, heads: int):
    B, L, _ = qkv.shape
    return qkv.reshape(B, L, 3, heads, -1).permute(2, 0, 3, 1, 4)  # K B H L D


class DoubleStreamBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: float, qkv_bias: bool):
        super().__init__()
        mlp_hidden = int(hidden * mlp_ratio)
        self.num_heads = heads
        self.img_mod = Modulation(hidden, double=True)
        self.img_norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.img_attn = SelfAttention(hidden, heads, qkv_bias)
        self.img_norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.img_mlp = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.GELU(approximate="tanh"),
                                     nn.Linear(mlp_hidden, hidden))
        self.txt_mod = Modulation(hidden, double=True)
        self.txt_norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.txt_attn = SelfAttention(hidden, heads, qkv_bias)
        self.txt_norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.txt_mlp = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.GELU(approximate="tanh"),
                                     nn.Linear(mlp_hidden, hidden))

    def forward(self, img, txt, vec, pe):
        im, tm = self.img_mod(vec), self.txt_mod(vec)
        i1, i2, t1, t2 = im[:3], im[3:], tm[:3], tm[3:]  # (shift, scale, gate) of attention, then of MLP
        img_q, img_k, img_v = split_qkv(self.img_attn.qkv((1 + i1[1]) * self.img_norm1(img) + i1[0]), self.num_heads)
        img_q, img_k = self.img_attn.norm(img_q, img_k, img_v)
        txt_q, txt_k, txt_v = split_qkv(self.txt_attn.qkv((1 + t1[1]) * self.txt_norm1(txt) + t1[0]), self.num_heads)
        txt_q, txt_k = self.txt_attn.norm(txt_q, txt_k, txt_v)
        attn = attention(torch.cat((txt_q, img_q), dim=2), torch.cat((txt_k, img_k), dim=2),
                         torch.cat((txt_v, img_v), dim=2), pe)
        txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]
        img = img + i1[2] * self.img_attn.proj(img_attn)
        img = img + i2[2] * self.img_mlp((1 + i2[1]) * self.img_norm2(img) + i2[0])
        txt = txt + t1[2] * self.txt_attn.proj(txt_attn)
        txt = txt + t2[2] * self.txt_mlp((1 + t2[1]) * self.txt_norm2(txt) + t2[0])
        return img, txt


class SingleStreamBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.hidden, self.num_heads = hidden, heads
        self.mlp_hidden = int(hidden * mlp_ratio)
        self.linear1 = nn.Linear(hidden, hidden * 3 + self.mlp_hidden)
        self.linear2 = nn.Linear(hidden + self.mlp_hidden, hidden)
        self.norm = QKNorm(hidden // heads)
        self.pre_norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp_act = nn.GELU(approximate="tanh")
        self.modulation = Modulation(hidden, double=False)

    def forward(self, x, vec, pe):
        shift, scale, gate = self.modulation(vec)
        qkv, mlp = torch.split(self.linear1((1 + scale) * self.pre_norm(x) + shift),
                               [3 * self.hidden, self.mlp_hidden], dim=-1)
        q, k, v = split_qkv(qkv, self.num_heads)
        q, k = self.norm(q, k, v)
        attn = attention(q, k, v, pe)
        return x + gate * self.linear2(torch.cat((attn, self.mlp_act(mlp)), 2))


class LastLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden, bias=True))

    def forward(self, x, vec):
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
        return self.linear((1 + scale[:, None, :]) * self.norm_final(x) + shift[:, None, :])


class Flux(nn.Module):
    """The reference Flux on packed tokens (forward) plus flowtrain's image-space wrapper."""

    def __init__(self, in_channels: int, patch: int, hidden: int, heads: int, depth: int, depth_single: int,
                 context_dim: int, vec_dim: int, axes_dim: list[int], theta: float, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, guidance_embed: bool = False):
        super().__init__()
        self.in_channels, self.patch = in_channels, patch
        self.axes_dim, self.theta, self.guidance_embed = axes_dim, theta, guidance_embed
        token_dim = in_channels * patch * patch
        self.img_in = nn.Linear(token_dim, hidden, bias=True)
        self.time_in = MLPEmbedder(256, hidden)
        self.vector_in = MLPEmbedder(vec_dim, hidden)
        self.guidance_in = MLPEmbedder(256, hidden) if guidance_embed else nn.Identity()
        self.txt_in = nn.Linear(context_dim, hidden)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(hidden, heads, mlp_ratio, qkv_bias) for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(hidden, heads, mlp_ratio) for _ in range(depth_single))
        self.final_layer = LastLayer(hidden, token_dim)

    def forward_tokens(self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None):
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 256))
        if self.guidance_embed:
            vec = vec + self.guidance_in(timestep_embedding(guidance, 256))
        vec = vec + self.vector_in(y)
        txt = self.txt_in(txt)
        pe = embed_nd(torch.cat((txt_ids, img_ids), dim=1), self.axes_dim, self.theta)
        for block in self.double_blocks:
            img, txt = block(img, txt, vec, pe)
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = block(x, vec, pe)
        return self.final_layer(x[:, txt.shape[1]:, ...], vec)

    def forward(self, x, t, txt, vec, guidance=None):
        """x [B, C, H, W] -> velocity [B, C, H, W] (flowtrain's FluxImpl::forward)."""
        B, C, H, W = x.shape
        p = self.patch
        h, w = H // p, W // p
        img = x.reshape(B, C, h, p, w, p).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, C * p * p)
        ids = torch.zeros(h, w, 3, device=x.device)
        ids[..., 1] += torch.arange(h, device=x.device)[:, None]
        ids[..., 2] += torch.arange(w, device=x.device)[None, :]
        img_ids = ids.reshape(1, h * w, 3).expand(B, -1, -1)
        txt_ids = torch.zeros(B, txt.shape[1], 3, device=x.device)
        out = self.forward_tokens(img, img_ids, txt, txt_ids, t, vec, guidance)
        return out.reshape(B, h, w, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


class TextEncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, mlp_hidden: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_hidden)
        self.fc2 = nn.Linear(mlp_hidden, width)

    def forward(self, x, attend):
        B, L, W = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(B, L, 3, self.heads, W // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        h = x + self.proj(a.transpose(1, 2).reshape(B, L, W))
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h)), approximate="tanh"))


class TextEncoder(nn.Module):
    """flowtrain's built-in text encoder (models/text/text_encoder.h), the same function."""

    def __init__(self, vocab_size: int, length: int, width: int, depth: int, heads: int, pooled_dim: int,
                 mlp_ratio: float = 4.0):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Parameter(torch.zeros(length, width))
        self.layers = nn.ModuleList(TextEncoderLayer(width, heads, int(width * mlp_ratio)) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width)
        self.pooled_proj = nn.Linear(width, pooled_dim)

    def forward(self, tokens, mask):
        B, L = tokens.shape
        has_text = mask.any(1)
        attend = (mask | ~has_text[:, None]).reshape(B, 1, 1, L)
        x = self.token_embedding(tokens) + self.position_embedding[:L]
        for layer in self.layers:
            x = layer(x, attend)
        real = mask[:, :, None].to(x.dtype)
        txt = self.final_norm(x) * real
        pooled = self.pooled_proj(txt.sum(1) / real.sum(1).clamp_min(1.0))
        return txt, pooled * has_text[:, None].to(pooled.dtype)


class TextToImage(nn.Module):
    """flowtrain's TextToImage: the encoder's txt / vec condition the transformer."""

    def __init__(self, text_encoder: TextEncoder, transformer: Flux):
        super().__init__()
        self.text_encoder = text_encoder
        self.transformer = transformer

    def forward(self, x, t, tokens, mask):
        txt, vec = self.text_encoder(tokens, mask)
        return self.transformer(x, t, txt, vec)
