#!/usr/bin/env python3
"""Writes tests/data/flux_reference_tiny.safetensors: a tiny FLUX.1 transformer run by the
reference implementation itself (black-forest-labs/flux, src/flux/model.py), for
tests/unit/test_flux.cpp to compare flowtrain's Flux against.

    PYTHONPATH=/path/to/flux/src python tests/data/make_flux_reference.py

The file holds the model's weights under their reference names ("model.<key>"), the inputs of
the reference forward (img, img_ids, txt, txt_ids, timesteps, y, guidance) and its output
("out"), fp32. Weights are N(0, 0.1²) everywhere (modulations included, so no block is the
identity), seeded.
"""
import os
import sys

import torch
from safetensors.torch import save_file

from flux.model import Flux, FluxParams  # the reference code, from PYTHONPATH

torch.manual_seed(0)
params = FluxParams(in_channels=64, out_channels=64, vec_in_dim=16, context_in_dim=32, hidden_size=64, mlp_ratio=4.0,
                    num_heads=2, depth=1, depth_single_blocks=2, axes_dim=[8, 12, 12], theta=10000, qkv_bias=True,
                    guidance_embed=True)
model = Flux(params).eval()
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0.0, 0.1)

B, h, w, L = 2, 4, 3, 5
img = torch.randn(B, h * w, 64)
img_ids = torch.zeros(h, w, 3)
img_ids[..., 1] += torch.arange(h)[:, None]
img_ids[..., 2] += torch.arange(w)[None, :]
img_ids = img_ids.reshape(1, h * w, 3).repeat(B, 1, 1)
txt = torch.randn(B, L, 32)
txt_ids = torch.zeros(B, L, 3)
timesteps = torch.tensor([0.3, 0.8])
y = torch.randn(B, 16)
guidance = torch.tensor([3.5, 1.0])
with torch.no_grad():
    out = model(img=img, img_ids=img_ids, txt=txt, txt_ids=txt_ids, timesteps=timesteps, y=y, guidance=guidance)

tensors = {"model." + k: v.contiguous() for k, v in model.state_dict().items()}
tensors.update(img=img, img_ids=img_ids, txt=txt, txt_ids=txt_ids, timesteps=timesteps, y=y, guidance=guidance,
               out=out)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flux_reference_tiny.safetensors")
save_file(tensors, path, metadata={"source": "black-forest-labs/flux src/flux/model.py", "torch": torch.__version__})
print(f"wrote {path}: out {tuple(out.shape)}, |out| mean {out.abs().mean():.4f}", file=sys.stderr)
