"""A CUDA load for hack/hardware-check.sh: holds MIB MiB of GPU memory and multiplies
bf16 matrices for SECONDS, busy for about DUTY of the time (default 1: always), so the
GPU, or this process's share of it, reads busy. Usage: gpu-load.py SECONDS MIB [DUTY]"""
import sys
import time

import torch

secs, mib = float(sys.argv[1]), int(sys.argv[2])
duty = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
held = torch.empty(mib * (1 << 20), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("loaded", flush=True)
end = time.time() + secs
while time.time() < end:
    t0 = time.time()
    for _ in range(20 if duty >= 1 else 2):
        c = a @ b
    torch.cuda.synchronize()
    if duty < 1:
        time.sleep((time.time() - t0) * (1 - duty) / duty)
