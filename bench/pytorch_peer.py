#!/usr/bin/env python3
"""The plain-PyTorch peer of `flowtrain bench`: the same model (DiT, or Flux with flowtrain's
built-in text encoder) and the same training step in eager PyTorch (or torch.compile), started
from flowtrain's initial weights.

    python bench/pytorch_peer.py --dump PARITY.safetensors --steps N --warmup W --threads T \
        [--compile] [--device cpu|cuda] [--json OUT]

1. Parity: builds the model from the dump's metadata, loads its `model.*` weights, computes the
   flow-matching loss on the dump's x0 / conditioning (labels; or tokens + txt_mask) / t / noise
   and compares it with the dump's
   `loss` (flowtrain's first-step loss on the same inputs). PASS if the relative difference is
   at most 1e-5, else FAIL and exit 1.
2. Timing: W warm-up steps, then N timed steps of the training step of flowtrain's
   Trainer::train_step on synthetic data of the same shapes, reported with the keys of
   flowtrain's BenchReport JSON.

Exit codes: 0 ok, 1 parity FAIL, 2 usage, 3 torch.compile failed (the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

_T_START = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_dit import DiT  # noqa: E402
from pytorch_flux import Flux, TextEncoder, TextToImage  # noqa: E402

# Relative tolerance of the loss parity. Both sides compute the same fp32 function, but possibly
# with different kernels and summation orders (oneDNN/MKL/cuBLAS blocking, SDPA backend, inductor's
# fused kernels, the order of the final mean). Each fp32 operation rounds at u = 2^-24 ~ 6e-8; a
# mean over the 10^4-10^6 elements of a batch has a worst-case relative error ~ log2(n) u (blocked
# or pairwise sums, ~1e-6), and the forward's per-layer rounding largely averages out in the mean.
# For a loss of order 1 that keeps honest disagreement below 1e-5. Measured on trained weights
# (the network check below, tiny config): a sin/cos swap in the timestep features moves the loss
# by 2e-2, the timestep scale by 2e-3, shift/scale or the position table's row/column halves by
# 7e-4 -- all caught; GELU erf-vs-tanh (2e-6) and LayerNorm eps 1e-5-vs-1e-6 (4e-7) are below
# fp32 loss resolution and are left to flowtrain's unit tests against float64 references.
PARITY_RTOL = 1e-5


# What flowtrain's step does, from the dump's metadata: the peer does the same work or refuses.
STEP_KEYS = ["precision", "grad_clip", "ema_decay", "ema_warmup", "beta1", "beta2", "eps", "weight_decay",
             "timesteps", "logit_mean", "logit_std", "shift", "activation_checkpointing", "tf32"]


def unsupported(meta: dict) -> str:
    """Why the peer cannot run the same step as flowtrain ('' if it can)."""
    if meta["precision"] not in ("fp32", "bf16"):
        return f"train.precision={meta['precision']}"
    if meta["activation_checkpointing"] != "none":
        return (f"train.activation_checkpointing={meta['activation_checkpointing']} (the peer stores activations; "
                "comparing against it would compare unequal work)")
    if meta["timesteps"] not in ("uniform", "logit_normal"):
        return f"flow.timesteps={meta['timesteps']}"
    return ""


def ema_decay_at(decay: float, warmup: bool, steps_done: int) -> float:
    """flowtrain's Ema::decay_at: min(decay, (1+n)/(10+n)) with warm-up."""
    return min(decay, (1 + steps_done) / (10 + steps_done)) if warmup else decay


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics: the same as flowtrain's bench.cpp."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


class DiTTask:
    """model.arch dit: class labels condition the model; dropped labels become the null class."""

    meta_keys = ["hidden", "depth", "heads", "patch", "input_size", "in_channels", "num_classes", "class_dropout",
                 "learn_sigma", "mlp_ratio", "timestep_scale"]
    conditioning = ["labels"]

    def __init__(self, meta: dict):
        self.meta = meta
        self.num_classes, self.dropout = int(meta["num_classes"]), float(meta["class_dropout"])
        self.tokens_per_sample = (int(meta["input_size"]) // int(meta["patch"])) ** 2

    def build(self) -> nn.Module:
        m = self.meta
        return DiT(input_size=int(m["input_size"]), patch=int(m["patch"]), in_channels=int(m["in_channels"]),
                   hidden=int(m["hidden"]), depth=int(m["depth"]), heads=int(m["heads"]),
                   mlp_ratio=float(m["mlp_ratio"]), num_classes=int(m["num_classes"]),
                   learn_sigma=m["learn_sigma"] == "true", timestep_scale=float(m["timestep_scale"]))

    @staticmethod
    def velocity(model, x_t, t, cond):
        return model(x_t, t, cond["labels"])

    def synthetic(self, batch: int) -> dict:
        return {"labels": torch.randint(0, self.num_classes, (batch,))}

    def drop(self, cond: dict, rows: int, device) -> dict:
        if self.dropout <= 0:
            return cond
        drop = (torch.rand(rows) < self.dropout).to(device)
        return {"labels": torch.where(drop, torch.full_like(cond["labels"], self.num_classes), cond["labels"])}


class FluxTask:
    """model.arch flux with the built-in text encoder: tokens + mask condition the model; a dropped
    caption is a row whose mask is cleared (models/text/text_to_image.h)."""

    meta_keys = ["hidden", "depth", "depth_single", "heads", "patch", "input_size", "in_channels", "context_dim",
                 "vec_dim", "axes_dim", "theta", "mlp_ratio", "guidance_embed", "text_len", "text_encoder_layers",
                 "text_encoder_heads", "vocab_size", "text_dropout"]
    conditioning = ["tokens", "txt_mask"]

    def __init__(self, meta: dict):
        self.meta = meta
        self.text_len, self.vocab = int(meta["text_len"]), int(meta["vocab_size"])
        self.dropout = float(meta["text_dropout"])
        self.tokens_per_sample = (int(meta["input_size"]) // int(meta["patch"])) ** 2 + self.text_len

    def build(self) -> nn.Module:
        m = self.meta
        if m["guidance_embed"] == "true" or int(m["text_encoder_layers"]) == 0:
            raise SystemExit("pytorch_peer: the Flux peer covers the built-in text path without guidance embedding")
        encoder = TextEncoder(vocab_size=self.vocab, length=self.text_len, width=int(m["context_dim"]),
                              depth=int(m["text_encoder_layers"]), heads=int(m["text_encoder_heads"]),
                              pooled_dim=int(m["vec_dim"]))
        flux = Flux(in_channels=int(m["in_channels"]), patch=int(m["patch"]), hidden=int(m["hidden"]),
                    heads=int(m["heads"]), depth=int(m["depth"]), depth_single=int(m["depth_single"]),
                    context_dim=int(m["context_dim"]), vec_dim=int(m["vec_dim"]),
                    axes_dim=[int(a) for a in m["axes_dim"].split(",")], theta=float(m["theta"]),
                    mlp_ratio=float(m["mlp_ratio"]))
        return TextToImage(encoder, flux)

    @staticmethod
    def velocity(model, x_t, t, cond):
        return model(x_t, t, cond["tokens"], cond["txt_mask"])

    def synthetic(self, batch: int) -> dict:
        # Captions of 8 to text_len tokens (ids past the pad / unknown / end-of-text ids), padded.
        lengths = torch.randint(8, self.text_len + 1, (batch,))
        mask = torch.arange(self.text_len)[None, :] < lengths[:, None]
        tokens = torch.where(mask, torch.randint(3, self.vocab, (batch, self.text_len)), torch.zeros((), dtype=torch.long))
        return {"tokens": tokens, "txt_mask": mask}

    def drop(self, cond: dict, rows: int, device) -> dict:
        if self.dropout <= 0:
            return cond
        keep = (torch.rand(rows) >= self.dropout).to(device)
        return {"tokens": cond["tokens"], "txt_mask": cond["txt_mask"] & keep[:, None]}


def task_of(meta: dict):
    return FluxTask(meta) if meta.get("arch", "dit") == "flux" else DiTTask(meta)


def flow_matching_loss(task, model: nn.Module, x0: torch.Tensor, cond: dict, t: torch.Tensor,
                       noise: torch.Tensor) -> torch.Tensor:
    """Rectified flow, Flux/SD3 convention: t=0 data, t=1 noise; x_t = (1-t) x0 + t noise;
    target v = noise - x0; mean squared error in fp32 over the first C output channels."""
    tb = t.reshape(-1, *([1] * (x0.dim() - 1)))
    v = task.velocity(model, (1 - tb) * x0 + tb * noise, t, cond)
    if v.shape[1] != x0.shape[1]:
        v = v[:, : x0.shape[1]]  # learn-sigma: the velocity is the first C channels
    return F.mse_loss(v.float(), (noise - x0).float())


def read_dump(path: str):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    task = task_of(meta)
    required = task.meta_keys + ["batch_size", "grad_accum", "lr"] + STEP_KEYS
    missing = [k for k in required if k not in meta]
    if missing:
        raise SystemExit(f"{path}: metadata lacks {', '.join(missing)} (not a flowtrain parity dump, or one from an "
                         "older flowtrain: write it again with `flowtrain bench --parity-dump`)")
    for k in ["x0", "t", "noise", "loss"] + task.conditioning:
        if k not in tensors:
            raise SystemExit(f"{path}: no tensor '{k}' (not a flowtrain parity dump?)")
    return meta, tensors, task


def read_run_config(path: str) -> dict:
    """The two-level `section: / key: value  # comment` YAML that flowtrain writes as a run's
    config.yaml (no PyYAML needed): {"section.key": "value"}."""
    out, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.split("  #", 1)[0].rstrip()
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, _, value = line.strip().partition(":")
            if not line.startswith(" "):
                section = key
            elif section:
                out[f"{section}.{key}"] = value.strip().strip('"').strip("'")
    return out


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """flowtrain's data order (data/loader.cpp epoch_order): Fisher-Yates with splitmix64."""
    order = list(range(n))
    state = ((seed * 0x100000001B3) & _M64) ^ ((epoch + 0x51ED27) & _M64)
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & _M64
        j = _mix64(state) % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def step_seed(run_seed: int, rank: int, step: int, micro: int) -> int:
    """flowtrain's generator seed (trainer/trainer.cpp step_seed). The trainer's draw_step_inputs
    calls it as step_seed(run seed, 0, step, global row of the batch): one generator per row."""
    z = (run_seed * 0x9E3779B97F4A7C15) & _M64
    for v in (rank, step, micro):
        z = (z ^ (((v + 0x9E3779B97F4A7C15) + (z << 6) + (z >> 2)) & _M64)) & _M64
        z = _mix64(z)
    return z


class FlowtrainSyntheticRun:
    """Reproduces, bit for bit, the inputs of a step of `flowtrain train` on data.source=synthetic:
    the synthetic data set (data/loader.cpp make_synthetic_dataset), the loader's batch order and
    uint8 -> [-1, 1] conversion, and the draw of timesteps, noise and label dropout (trainer.cpp
    draw_step_inputs -> models/flow_matching.cpp draw_flow_matching_inputs_per_row: each row of the
    global batch from its own CPU generator seeded with step_seed(seed, 0, step, row), drawing t,
    then the row's noise, then its dropout uniform), all from torch's CPU generator, which is the
    same code in LibTorch and PyTorch. For data-parallel rank 0 of a world of 1.
    Flux runs add the synthetic captions (trainer/run_conditioning.cpp synthetic_text_fields: a
    generator seeded with seed + 1 draws each row's length, then the token ids); a dropped caption
    is a row whose mask is cleared."""

    def __init__(self, cfg: dict, shift: float):
        self.seed = int(cfg["run.seed"])
        self.batch, self.accum = int(cfg["data.batch_size"]), int(cfg["train.grad_accum"])
        self.flux = cfg.get("model.arch", "dit") == "flux"
        # model.num_classes is a DiT key; a text-conditioned model's samples carry the one label 0
        # (trainer/builders.cpp), drawn after the images either way.
        self.num_classes = 1 if self.flux else int(cfg["model.num_classes"])
        self.dropout = float(cfg["model.text_dropout" if self.flux else "model.class_dropout"])
        # The trainer's time shift (flow.shift, or Flux's resolution shift), from the parity dump.
        self.timesteps, self.shift = cfg["flow.timesteps"], shift
        self.logit_mean, self.logit_std = float(cfg["flow.logit_mean"]), float(cfg["flow.logit_std"])
        channels, side = int(cfg["model.in_channels"]), int(cfg["model.image_size"])
        self.n = max(4096, self.batch)
        gen = torch.Generator().manual_seed(self.seed)
        self.images = torch.randint(0, 256, (self.n, channels, side, side), generator=gen, dtype=torch.uint8)
        self.labels = torch.randint(0, self.num_classes, (self.n,), generator=gen, dtype=torch.long)
        if self.flux:
            length, vocab = int(cfg["model.text_len"]), int(cfg["model.vocab_size"])
            text_gen = torch.Generator().manual_seed(self.seed + 1)
            lengths = torch.randint(min(8, length), length + 1, (self.n,), generator=text_gen, dtype=torch.long)
            self.txt_mask = torch.arange(length)[None, :] < lengths[:, None]
            ids = torch.randint(3, vocab, (self.n, length), generator=text_gen, dtype=torch.long)
            self.tokens = ids * self.txt_mask.long()

    def micro_batches(self, step: int):
        """(x0, conditioning, t, noise) of each micro-batch of the step that starts at `step`
        (0-based); conditioning {"labels"} or, for Flux, {"tokens", "txt_mask"}."""
        per_epoch = self.n // self.batch
        epoch, position = step // per_epoch, (step % per_epoch) * self.batch
        index = torch.tensor(epoch_order(self.n, self.seed, epoch)[position:position + self.batch])
        images = self.images.index_select(0, index).to(torch.float32).div_(127.5).sub_(1.0)
        labels = self.labels.index_select(0, index)
        micro = self.batch // self.accum
        for m in range(self.accum):
            rows = slice(m * micro, (m + 1) * micro)
            x0, y = images[rows], labels[rows]
            t, noise, drop = self.draw(step, first_row=m * micro, x0=x0)
            if self.flux:
                tokens, mask = self.tokens.index_select(0, index)[rows], self.txt_mask.index_select(0, index)[rows]
                if drop is not None:
                    mask = mask & ~drop[:, None]
                yield x0, {"tokens": tokens, "txt_mask": mask}, t, noise
                continue
            if drop is not None:
                y = torch.where(drop, torch.full_like(y, self.num_classes), y)
            yield x0, {"labels": y}, t, noise

    def draw(self, step: int, first_row: int, x0: torch.Tensor):
        """(t [B] float32, noise like x0, dropout mask [B] or None) of rows [first_row, first_row + B)
        of step `step`'s global batch: draw_flow_matching_inputs_per_row with the trainer's seeds."""
        ts, noises, drops = [], [], []
        for i in range(x0.shape[0]):
            gen = torch.Generator().manual_seed(step_seed(self.seed, 0, step, first_row + i))
            if self.timesteps == "uniform":
                t = torch.rand(1, generator=gen, dtype=torch.float32)
            else:
                t = torch.sigmoid(torch.randn(1, generator=gen, dtype=torch.float32) * self.logit_std
                                  + self.logit_mean)
            if self.shift != 1.0:
                t = self.shift * t / (1 + (self.shift - 1) * t)
            ts.append(t)
            noises.append(torch.randn(x0.shape[1:], generator=gen, dtype=x0.dtype))
            if self.dropout > 0:
                drops.append(torch.rand(1, generator=gen, dtype=torch.float32))
        drop = torch.cat(drops) < self.dropout if self.dropout > 0 else None
        return torch.cat(ts), torch.stack(noises), drop


def check_trained_run(run_dir: str, meta: dict, dump: dict, device: torch.device) -> tuple[bool, str]:
    """Network parity on trained weights. `run_dir` is a `flowtrain train` run on synthetic data
    with a checkpoint at step K and metrics for step K+1: the loss flowtrain logged for step K+1
    was computed with the step-K weights on inputs reproduced here, so the two must agree like the
    first-step loss -- but now every part of the network contributes (at initialisation the
    adaLN-Zero model outputs 0 and the first-step loss does not depend on it)."""
    cfg = read_run_config(os.path.join(run_dir, "config.yaml"))
    if cfg.get("data.source") != "synthetic":
        return True, f"network parity: skipped ({run_dir} is not a data.source=synthetic run)"
    steps = sorted(int(d.split("-")[1]) for d in os.listdir(os.path.join(run_dir, "checkpoints"))
                   if d.startswith("step-") and not d.endswith(".tmp"))
    metrics = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if "loss" in rec:  # training-step rows (checkpoint and eval rows share the file)
                    metrics[int(rec["step"])] = rec
    usable = [k for k in steps if k + 1 in metrics and k > 0]
    if not usable:
        return False, f"network parity: FAIL ({run_dir} has no checkpoint K > 0 with a logged step K+1)"
    k = usable[0]
    data = FlowtrainSyntheticRun(cfg, shift=float(meta["shift"]))
    task = task_of(meta)
    # The reproduction must give the dump's step-0 inputs exactly, or the comparison means nothing.
    x0, cond, t, noise = next(data.micro_batches(0))
    same = all(torch.equal(a, dump[name]) for a, name in ((x0, "x0"), (t, "t"), (noise, "noise")))
    same = same and all(torch.equal(cond[name], dump[name]) for name in task.conditioning)
    if not same:
        return False, ("network parity: FAIL (could not reproduce flowtrain's step-0 inputs from its config: "
                       "the loader, the synthetic data set or the draw changed; update FlowtrainSyntheticRun)")
    model = task.build()
    model.load_state_dict(load_file(os.path.join(run_dir, "checkpoints", f"step-{k:07d}", "model.safetensors")),
                          strict=True)
    model.to(device)
    loss = torch.zeros((), device=device)
    zero_loss = torch.zeros((), device=device)
    with torch.no_grad():
        for x0, cond, t, noise in data.micro_batches(k):
            x0, t, noise = (a.to(device) for a in (x0, t, noise))
            cond = {name: c.to(device) for name, c in cond.items()}
            loss += flow_matching_loss(task, model, x0, cond, t, noise) / data.accum
            zero_loss += F.mse_loss(torch.zeros_like(x0), noise - x0) / data.accum
    ok, line, _, _ = parity_line(f"network, step-{k} weights, step {k + 1} loss", float(loss),
                                 float(metrics[k + 1]["loss"]))
    contribution = abs(float(loss) - float(zero_loss)) / float(zero_loss)
    return ok, line + f" | the network moves the loss {contribution:.1%} from an all-zero output"


def parity_line(name: str, loss: float, reference: float) -> tuple[bool, str, float, float]:
    abs_diff = abs(loss - reference)
    rel_diff = abs_diff / max(abs(reference), 1e-30)
    ok = rel_diff <= PARITY_RTOL
    line = (f"parity ({name}): pytorch {loss:.9f} | flowtrain {reference:.9f} | abs diff {abs_diff:.3e} | "
            f"rel diff {rel_diff:.3e} (tolerance {PARITY_RTOL:.0e}) -> {'PASS' if ok else 'FAIL'}")
    return ok, line, abs_diff, rel_diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="parity dump written by `flowtrain bench --parity-dump`")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (0: parity checks only)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (include compilation)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = torch's default)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default: eager)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--json", help="write the report here (keys of flowtrain's BenchReport)")
    ap.add_argument("--check-run", metavar="RUN_DIR",
                    help="also check the loss on trained weights against this `flowtrain train` run on synthetic "
                         "data (a checkpoint at step K, metrics for step K+1; see compare_pytorch.sh)")
    args = ap.parse_args()
    if args.steps < 0 or args.warmup < 0:
        ap.error("--steps and --warmup must be >= 0")

    rss_after_import = rss_bytes()
    import_s = time.perf_counter() - _T_START
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("pytorch_peer: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    implementation = "pytorch-compile" if args.compile else "pytorch-eager"

    # ---- parity ---------------------------------------------------------------------------
    meta, dump, task = read_dump(args.dump)
    why = unsupported(meta)
    if why:
        print(f"pytorch_peer: cannot run flowtrain's step with {why}: no comparison", file=sys.stderr)
        return 2
    precision = meta["precision"]
    model = task.build()
    state = {k[len("model."):]: v for k, v in dump.items() if k.startswith("model.")}
    model.load_state_dict(state, strict=True)  # the names and shapes must match exactly
    model.to(device)
    C = int(meta["in_channels"])
    x0, t, noise = (dump[k].to(device) for k in ("x0", "t", "noise"))
    cond = {k: dump[k].to(device) for k in task.conditioning}
    reference = float(dump["loss"])
    with torch.no_grad():
        v = task.velocity(model, (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise, t, cond)
        eager_loss = float(flow_matching_loss(task, model, x0, cond, t, noise))
    ok, line, abs_diff, rel_diff = parity_line("eager", eager_loss, reference)
    print(line, flush=True)
    if bool((v == 0).all()):
        print("parity note: the dumped weights make the model output exactly 0 (adaLN-Zero initialisation), so "
              "this check covers the inputs, the interpolation and the loss, not the network"
              + ("" if args.check_run else "; --check-run tests the network on trained weights"), flush=True)
    del v
    parity_ok = ok
    if args.check_run:
        ok, line = check_trained_run(args.check_run, meta, dump, device)
        print(line, flush=True)
        parity_ok = parity_ok and ok
    if args.steps == 0:
        return 0 if parity_ok else 1

    # ---- the training step (flowtrain: Trainer::train_step) -------------------------------
    batch = int(meta["batch_size"])
    accum = int(meta["grad_accum"])
    micro = batch // accum
    side = int(meta["input_size"])
    tokens_per_sample = task.tokens_per_sample
    model.train()
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]  # pos_embed is fixed, as in flowtrain's AdamW
    # The optimizer, clip and EMA of flowtrain's config (the dump's metadata). Implementation:
    # fused=True, the same ATen kernel (at::_fused_adamw_) flowtrain calls, on the CPU as on CUDA:
    # the default would be a per-tensor loop on the CPU, and the comparison is of the training
    # step, not of a flag a PyTorch user can set.
    optimizer = torch.optim.AdamW(trainable, lr=float(meta["lr"]), betas=(float(meta["beta1"]), float(meta["beta2"])),
                                  eps=float(meta["eps"]), weight_decay=float(meta["weight_decay"]), fused=True)
    grad_clip, ema_decay = float(meta["grad_clip"]), float(meta["ema_decay"])
    ema_warmup = meta["ema_warmup"] == "true"
    ema = [p.detach().clone() for p in params] if ema_decay > 0 else []  # flowtrain's EMA covers every parameter
    logit_mean, logit_std, shift = float(meta["logit_mean"]), float(meta["logit_std"]), float(meta["shift"])

    run_model = model
    compile_s = 0.0
    if args.compile:
        run_model = torch.compile(model)
        # Compile (forward and backward graphs) on the parity batch: also checks the compiled
        # model's loss against flowtrain's.
        t0 = time.perf_counter()
        try:
            compiled_loss = flow_matching_loss(task, run_model, x0, cond, t, noise)
            compiled_loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001 - any compile failure is reported, not raised
            reason = f"{type(e).__name__}: {e}".strip().splitlines()
            print("torch.compile failed: " + " | ".join(reason[:8]), flush=True)
            return 3
        compile_s = time.perf_counter() - t0
        optimizer.zero_grad(set_to_none=True)
        ok, line, abs_diff, rel_diff = parity_line("compile", float(compiled_loss.detach()), reference)
        print(line + f" (compiled in {compile_s:.1f} s)", flush=True)
        parity_ok = parity_ok and ok
    first_loss = eager_loss if not args.compile else float(compiled_loss.detach())
    del x0, cond, t, noise, dump, state

    def synthetic_batch():
        # Like flowtrain's loader: images in [-1, 1] and their conditioning, made on the CPU each step.
        images = torch.rand(batch, C, side, side) * 2 - 1
        return images, task.synthetic(batch)

    step_count = [0]

    def train_step() -> float:
        images, conditioning = synthetic_batch()
        images = images.to(device)
        conditioning = {k: v.to(device) for k, v in conditioning.items()}
        total = torch.zeros((), device=device)
        for m in range(accum):
            xm = images[m * micro:(m + 1) * micro]
            cm = {k: v[m * micro:(m + 1) * micro] for k, v in conditioning.items()}
            # The flow-matching draw of flowtrain's config, on the CPU like flowtrain's CPU path:
            # t (logit-normal or uniform, shifted), noise, conditioning dropout.
            if meta["timesteps"] == "uniform":
                tm = torch.rand(micro)
            else:
                tm = torch.sigmoid(torch.randn(micro) * logit_std + logit_mean)
            if shift != 1.0:
                tm = shift * tm / (1 + (shift - 1) * tm)
            tm = tm.to(device)
            nm = torch.randn(xm.shape).to(device)
            cm = task.drop(cm, micro, device)
            # bf16: autocast over the forward and the loss, as flowtrain's train.precision=bf16.
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = flow_matching_loss(task, run_model, xm, cm, tm, nm)
            (loss / accum).backward()
            total += loss.detach() / accum
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ema:
            with torch.no_grad():
                decay = ema_decay_at(ema_decay, ema_warmup, step_count[0])
                torch._foreach_lerp_(ema, [p.detach() for p in params], 1.0 - decay)
        step_count[0] += 1
        return float(total)  # host sync, like flowtrain's per-step loss.item()

    # The parity checks ran at full fp32 (the dump's loss is a CPU fp32 one); the timed steps use
    # flowtrain's train.tf32 on CUDA: the same fp32 matmul precision on both sides.
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if meta["tf32"] == "true" else "highest")
    rss_before_first_step = rss_bytes()
    step_times = []
    try:
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            train_step()
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                step_times.append(dt)
    except Exception as e:  # noqa: BLE001
        if not args.compile:
            raise
        reason = f"{type(e).__name__}: {e}".strip().splitlines()
        print("torch.compile failed during training: " + " | ".join(reason[:8]), flush=True)
        return 3

    if device.type == "cuda":
        memory_kind, peak = "cuda peak allocated", torch.cuda.max_memory_allocated(device)
    else:
        memory_kind, peak = "cpu peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    median = quantile(step_times, 0.5)
    report = {
        "implementation": implementation,
        "device": str(device),
        "precision": precision,
        "threads": torch.get_num_threads(),
        "batch": batch,
        "tokens_per_sample": tokens_per_sample,
        "steps": args.steps,
        "warmup": args.warmup,
        "params_m": sum(p.numel() for p in params) / 1e6,
        "step_time_median_s": median,
        "step_time_p10_s": quantile(step_times, 0.1),
        "step_time_p90_s": quantile(step_times, 0.9),
        "step_time_min_s": quantile(step_times, 0.0),
        "step_time_max_s": quantile(step_times, 1.0),
        "samples_per_s": batch / median,
        "tokens_per_s": batch / median * tokens_per_sample,
        "peak_memory_bytes": int(peak),
        "memory_kind": memory_kind,
        "rss_after_import_bytes": rss_after_import,
        "rss_before_first_step_bytes": rss_before_first_step,
        "first_loss": first_loss,  # on the parity batch; the compiled model's under --compile
        "reference_loss": reference,  # the dump's loss (flowtrain)
        "eager_loss": eager_loss,
        "parity_abs_diff": abs_diff,
        "parity_rel_diff": rel_diff,
        "parity": "PASS" if parity_ok else "FAIL",
        "import_s": import_s,
        "compile_s": compile_s,
        "torch_version": torch.__version__,
        "grad_accum": accum,
    }
    mib = 1 / 1048576
    print(f"{implementation} on {device} ({precision}, {report['threads']} threads) | batch {batch} x {tokens_per_sample} "
          f"tokens ({accum} micro-batches) | {report['params_m']:.2f}M params | torch {torch.__version__}")
    print(f"step time median {median:.4f} s (p10 {report['step_time_p10_s']:.4f}, p90 {report['step_time_p90_s']:.4f}, "
          f"min {report['step_time_min_s']:.4f}, max {report['step_time_max_s']:.4f}) over {args.steps} steps after "
          f"{args.warmup} warm-up | {report['samples_per_s']:.1f} samples/s")
    print(f"{memory_kind} {peak * mib:.1f} MiB | RSS after `import torch` {rss_after_import * mib:.1f} MiB, "
          f"before the first step {rss_before_first_step * mib:.1f} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0 if parity_ok else 1


if __name__ == "__main__":
    sys.exit(main())
