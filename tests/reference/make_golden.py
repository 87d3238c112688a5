#!/usr/bin/env python3
"""Golden files from the reference implementations' own code, for flowtrain's unit tests.

Each section builds a reference model at a tiny size with seeded random weights, saves the
weights under the official key names, fixed inputs and the reference's outputs. The C++ tests
(tests/unit/test_autoencoder.cpp, …) load the weights strictly and compare. Run by hand when a
reference or a section changes, and commit what it writes to tests/reference/golden/:

  FLOWTRAIN_DEPS=~/.cache/flowtrain                   # where scripts/setup.sh put the PyPI torch
  $FLOWTRAIN_DEPS/torch-2.11.0/bin/pip install einops safetensors
  # the FLUX reference: git clone https://github.com/black-forest-labs/flux (commit 802fb47; the src/ folder is enough)
  $FLOWTRAIN_DEPS/torch-2.11.0/bin/python tests/reference/make_golden.py --flux-src FLUX/src

Sections:
  ae   the FLUX autoencoder (flux/modules/autoencoder.py): ae_tiny.safetensors (weights),
       ae_tiny_io.safetensors (x, moments, z = encode(x), decode(z)), and ae_flux_keys.txt:
       every key and shape of the full-size FLUX.1 autoencoder, built on the meta device.
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def seeded_weights(module: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn N(0, 1) / sqrt(fan-in-ish), so activations stay O(1) through the
    net, and every GroupNorm/LayerNorm affine perturbed off (1, 0) so a swapped weight/bias shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def write_key_manifest(module: torch.nn.Module, path: str) -> None:
    with open(path, "w") as f:
        for name, t in module.state_dict().items():
            f.write(f"{name} {','.join(str(d) for d in t.shape)}\n")


def autoencoder(flux_src: str) -> None:
    sys.path.insert(0, flux_src)
    from flux.modules import autoencoder as ae_module

    # The full-size FLUX.1 autoencoder's keys and shapes (official ae.safetensors layout), with
    # the parameters of flux/util.py's configs (the same for dev, schnell and Krea; util.py itself
    # is not imported: it needs the hub, watermarking and image packages).
    flux_params = ae_module.AutoEncoderParams(resolution=256, in_channels=3, ch=128, out_ch=3, ch_mult=[1, 2, 4, 4],
                                              num_res_blocks=2, z_channels=16, scale_factor=0.3611,
                                              shift_factor=0.1159)
    with torch.device("meta"):
        full = ae_module.AutoEncoder(flux_params)
    write_key_manifest(full, os.path.join(GOLDEN, "ae_flux_keys.txt"))

    # A tiny one: the reference's code with GroupNorm(32) built as GroupNorm(4) (through the
    # module's own `nn` name), since 32 groups need >= 32 channels everywhere and the golden
    # weights would be MBs. Widths 8 and 16 exercise the channel-changing nin_shortcut.
    class FewGroupsNN:
        def __getattr__(self, name):
            return _group_norm_4 if name == "GroupNorm" else getattr(torch.nn, name)

    def _group_norm_4(num_groups, num_channels, eps, affine):
        return torch.nn.GroupNorm(4, num_channels, eps=eps, affine=affine)

    ae_module.nn = FewGroupsNN()
    params = ae_module.AutoEncoderParams(resolution=16, in_channels=3, ch=8, out_ch=3, ch_mult=[1, 2],
                                         num_res_blocks=1, z_channels=4, scale_factor=0.3611,
                                         shift_factor=0.1159)
    torch.manual_seed(0)
    model = ae_module.AutoEncoder(params).eval()
    seeded_weights(model, seed=1)
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(2, 3, 16, 12, generator=gen) * 2 - 1  # not square: rows and columns kept apart
    with torch.no_grad():
        moments = model.encoder(x)
        z = model.encode(x)
        decoded = model.decode(z)
    meta = {"ch": "8", "ch_mult": "1,2", "num_res_blocks": "1", "z_channels": "4", "norm_groups": "4",
            "scale_factor": "0.3611", "shift_factor": "0.1159", "torch": torch.__version__}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(GOLDEN, "ae_tiny.safetensors"), metadata=meta)
    save_file({"x": x, "moments": moments, "z": z, "decoded": decoded},
              os.path.join(GOLDEN, "ae_tiny_io.safetensors"), metadata=meta)
    print(f"ae: {sum(p.numel() for p in model.parameters())} parameters, "
          f"|decoded| max {decoded.abs().max():.3f}, full-size keys {len(full.state_dict())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flux-src", required=True, help="the src/ folder of black-forest-labs/flux")
    parser.add_argument("sections", nargs="*", help="which to write (default: all): ae")
    args = parser.parse_args()
    args.sections = args.sections or ["ae"]
    for section in args.sections:
        if section not in ("ae",):
            parser.error(f"unknown section '{section}'")
    os.makedirs(GOLDEN, exist_ok=True)
    torch.set_num_threads(1)
    if "ae" in args.sections:
        autoencoder(args.flux_src)


if __name__ == "__main__":
    main()
