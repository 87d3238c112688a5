"""Which CPU attention is faster at which sequence length: ATen's SDPA (the CPU flash kernel) or
the plain composition softmax((q/sqrt(Dh)) k^T) v with batched GEMMs. Forward + backward, fp32,
[B, H, N, Dh] with B*N ~ 6272 tokens (the default Fashion config's batch), median of 10 after 2.

    ~/.cache/flowtrain/torch-2.11.0/bin/python bench/attention_cpu.py [--threads 2]

flowtrain's default_attention (models/layers.h) takes the composition up to
kMathAttentionMaxTokens; docs/perf.md has the table this prints on the CI machine.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(fn, reps=10, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, torch {torch.__version__}")
    print(f"{'B':>5} {'H':>3} {'N':>5} {'Dh':>4} {'sdpa ms':>9} {'math ms':>9} {'math/sdpa':>10}")
    for n, dh, h in [(16, 32, 4), (49, 32, 4), (64, 64, 6), (100, 64, 6), (144, 64, 6), (196, 64, 6),
                     (256, 64, 6), (256, 32, 4)]:
        b = max(1, 6272 // n)
        q, k, v = (torch.randn(b, h, n, dh, requires_grad=True) for _ in range(3))
        g = torch.randn(b, h, n, dh)

        def sdpa():
            F.scaled_dot_product_attention(q, k, v).backward(g)

        def math():
            (torch.softmax((q * dh ** -0.5) @ k.transpose(-1, -2), -1) @ v).backward(g)

        t_sdpa, t_math = median_ms(sdpa), median_ms(math)
        print(f"{b:>5} {h:>3} {n:>5} {dh:>4} {t_sdpa:>9.1f} {t_math:>9.1f} {t_math / t_sdpa:>10.2f}")


if __name__ == "__main__":
    main()
