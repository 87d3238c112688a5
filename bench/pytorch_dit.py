"""A plain PyTorch DiT (Peebles & Xie, "Scalable Diffusion Models with Transformers"), the
comparison peer for flowtrain's C++ model (models/layers.cpp, models/dit/dit.cpp).

Written from the paper and the reference description (facebookresearch/DiT models.py); module
and parameter names follow the reference so that its checkpoints, flowtrain's exports and the
`model.*` tensors of a flowtrain parity dump (prefix stripped) load with `load_state_dict`:

    x_embedder.proj                      Conv2d(C, D, kernel = stride = patch)
    t_embedder.mlp.{0,2}                 Linear(256, D) -> SiLU -> Linear(D, D)
    y_embedder.embedding_table           Embedding(num_classes + 1, D)   (last row = null class)
    pos_embed                            [1, T, D] fixed 2-D sin-cos table (requires_grad=False)
    blocks.N.attn.{qkv,proj}             qkv with bias, heads split as [B, N, 3, H, Dh]
    blocks.N.mlp.{fc1,fc2}               D -> mlp_ratio*D, GELU(tanh), -> D
    blocks.N.adaLN_modulation.1          SiLU -> Linear(D, 6D)
    final_layer.{linear,adaLN_modulation.1}

Conventions shared with flowtrain (so both compute the same function):
- flow time t in [0, 1] is multiplied by `timestep_scale` (1000) before the 256-dim frequency
  embedding cat[cos, sin], f_k = exp(-ln(10000) k / 128);
- class-label dropout for classifier-free guidance is applied by the caller (flowtrain draws it
  with the timesteps and noise), not inside the label embedder as in the reference;
- learn_sigma doubles the output channels; the flow-matching loss uses the first C.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN modulation of tokens [B, N, D] by per-sample shift/scale [B, D]."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def timestep_embedding(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of (already scaled) timesteps t [B] -> [B, dim], cos first."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float().unsqueeze(1) * freqs.unsqueeze(0)
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def sincos_1d(dim: int, pos: torch.Tensor) -> torch.Tensor:
    """[M, dim] = cat[sin(pos w), cos(pos w)], w_k = 10000^(-k / (dim/2)), computed in float64."""
    omega = torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0)
    omega = 1.0 / (10000.0 ** omega)
    angles = torch.outer(pos.to(torch.float64), omega)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_pos_embed_2d(dim: int, grid: int) -> torch.Tensor:
    """[grid*grid, dim] table for tokens in row-major order: the first half of the channels
    encodes the column, the second half the row."""
    assert dim % 4 == 0, f"sin-cos position table needs dim % 4 == 0, got {dim}"
    coords = torch.arange(grid, dtype=torch.float64)
    col = coords.repeat(grid)
    row = coords.repeat_interleave(grid)
    return torch.cat([sincos_1d(dim // 2, col), sincos_1d(dim // 2, row)], dim=1).float()


class PatchEmbed(nn.Module):
    def __init__(self, in_channels: int, hidden: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, D, h, w] -> [B, h*w, D]


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t, self.frequency_dim))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, hidden: int):
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, hidden)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        assert hidden % heads == 0
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # [B, H, N, Dh]
        return self.proj(out.transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    def __init__(self, hidden: int, mlp_hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, mlp_hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(mlp_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, patch: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    def __init__(self, input_size: int = 32, patch: int = 2, in_channels: int = 4, hidden: int = 384,
                 depth: int = 12, heads: int = 6, mlp_ratio: float = 4.0, num_classes: int = 1000,
                 learn_sigma: bool = False, timestep_scale: float = 1000.0):
        super().__init__()
        assert input_size % patch == 0, f"input_size {input_size} not divisible by patch {patch}"
        self.input_size, self.patch, self.in_channels = input_size, patch, in_channels
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        self.timestep_scale = float(timestep_scale)
        self.grid = input_size // patch
        # Registration order = the reference's state_dict order.
        self.x_embedder = PatchEmbed(in_channels, hidden, patch)
        self.t_embedder = TimestepEmbedder(hidden)
        self.y_embedder = LabelEmbedder(num_classes, hidden)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid * self.grid, hidden), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden, heads, mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden, patch, self.out_channels)
        self.initialize_weights()

    @torch.no_grad()
    def initialize_weights(self) -> None:
        # xavier_uniform on every Linear, zero biases.
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.pos_embed.copy_(sincos_pos_embed_2d(self.pos_embed.shape[-1], self.grid).unsqueeze(0))
        # The patch embedding initialised like a Linear on [D, C*p*p].
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        # adaLN-Zero: every block starts as the identity, the model outputs 0.
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, h*w, p*p*c] (per token channel-last p, q, c) -> [B, c, h*p, w*p]."""
        B, c, p, h = tokens.shape[0], self.out_channels, self.patch, self.grid
        x = tokens.reshape(B, h, h, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(B, c, h * p, h * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x [B, C, H, W], flow time t [B] in [0, 1], labels y [B] -> velocity [B, C_out, H, W]."""
        tokens = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t * self.timestep_scale) + self.y_embedder(y)
        for block in self.blocks:
            tokens = block(tokens, c)
        return self.unpatchify(self.final_layer(tokens, c))

