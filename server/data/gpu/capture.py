"""Reads what a real NVIDIA GPU says about itself and about a known workload, through NVML
(the library DCGM and GPU Feature Discovery read), and writes it for Fairway's tests.

Run on a machine with one NVIDIA GPU, PyTorch and nvidia-ml-py:
    python3 capture.py OUT_DIR
Writes OUT_DIR/facts.json (driver, CUDA, product, memory; the GPU Feature Discovery labels
those give, by GFD's rules) and OUT_DIR/activity.csv (one row per 100 ms sample while the
GPU runs the phases below, with the phase named).
"""
import csv
import json
import os
import sys
import threading
import time

import pynvml as N
import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)


def text(v):
    return v.decode() if isinstance(v, bytes) else v


facts = {"captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
facts["driver_version"] = text(N.nvmlSystemGetDriverVersion())
cuda = N.nvmlSystemGetCudaDriverVersion_v2()
facts["cuda_driver_version"] = cuda
facts["product"] = text(N.nvmlDeviceGetName(h))
facts["memory_total_mib"] = N.nvmlDeviceGetMemoryInfo(h).total // 2**20
facts["compute_capability"] = list(N.nvmlDeviceGetCudaComputeCapability(h))
facts["gpus"] = N.nvmlDeviceGetCount()
try:
    facts["mig_mode"] = list(N.nvmlDeviceGetMigMode(h))
except N.NVMLError as e:
    facts["mig_mode"] = str(e)
try:
    facts["gpm_supported"] = bool(N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
except Exception as e:  # noqa: BLE001 - recorded, not fatal
    facts["gpm_supported"] = f"error: {e}"

# GPU Feature Discovery's CUDA labels (its `newVersionLabeler`): the driver's own version
# string split on dots, and the CUDA version the driver supports as major.minor.
major, minor, rev = (facts["driver_version"].split(".") + ["", ""])[:3]
cmaj, cmin = cuda // 1000, (cuda % 1000) // 10
facts["gfd_labels"] = {
    "nvidia.com/cuda.driver.major": major,
    "nvidia.com/cuda.driver.minor": minor,
    "nvidia.com/cuda.driver.rev": rev,
    "nvidia.com/cuda.runtime.major": str(cmaj),
    "nvidia.com/cuda.runtime.minor": str(cmin),
    "nvidia.com/cuda.driver-version.major": major,
    "nvidia.com/cuda.driver-version.minor": minor,
    "nvidia.com/cuda.driver-version.revision": rev,
    "nvidia.com/cuda.driver-version.full": facts["driver_version"],
    "nvidia.com/cuda.runtime-version.major": str(cmaj),
    "nvidia.com/cuda.runtime-version.minor": str(cmin),
    "nvidia.com/cuda.runtime-version.full": f"{cmaj}.{cmin}",
    "nvidia.com/gpu.product": facts["product"].replace(" ", "-"),
    "nvidia.com/gpu.memory": str(facts["memory_total_mib"]),
    "nvidia.com/gpu.count": str(facts["gpus"]),
    "nvidia.com/gpu.compute.major": str(facts["compute_capability"][0]),
    "nvidia.com/gpu.compute.minor": str(facts["compute_capability"][1]),
}

# GPM (Hopper's performance counters, what DCGM's PROF fields read on this generation):
# SM activity and tensor activity between two samples.
gpm = facts["gpm_supported"] is True


def gpm_read(prev):
    cur = N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, cur)
    if prev is None:
        return cur, None, None
    m = N.c_nvmlGpmMetricsGet_t()
    m.version = N.NVML_GPM_METRICS_GET_VERSION
    m.numMetrics = 2
    m.sample1 = prev
    m.sample2 = cur
    m.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
    m.metrics[1].metricId = N.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    N.nvmlGpmMetricsGet(m)
    N.nvmlGpmSampleFree(prev)
    return cur, m.metrics[0].value, m.metrics[1].value


phase = ["idle, nothing allocated"]
rows = []
stop = threading.Event()


def sampler():
    prev = None
    t0 = time.monotonic()
    while not stop.is_set():
        time.sleep(0.1)
        u = N.nvmlDeviceGetUtilizationRates(h)
        mem = N.nvmlDeviceGetMemoryInfo(h)
        sm = tensor = ""
        if gpm:
            try:
                prev, sm, tensor = gpm_read(prev)
            except Exception as e:  # noqa: BLE001
                facts["gpm_error"] = str(e)
                sm = tensor = ""
        rows.append([round(time.monotonic() - t0, 2), phase[0], u.gpu, u.memory,
                     mem.used // 2**20, "" if sm is None else sm, "" if tensor is None else tensor])


t = threading.Thread(target=sampler)
t.start()
time.sleep(3)

dev = torch.device("cuda")
phase[0] = "idle, 9 GiB held"
held = torch.ones(9 * 2**30 // 4, dtype=torch.float32, device=dev)
torch.cuda.synchronize()
time.sleep(4)

# One thread block spinning: the GPU is "busy" every instant (GPU utilisation counts time a
# kernel runs) while one of its many multiprocessors does anything.
phase[0] = "one block spinning"
end = time.monotonic() + 5
while time.monotonic() < end:
    torch.cuda._sleep(50_000_000)
    torch.cuda.synchronize()

a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
phase[0] = "bf16 matmul 2% of each second"
end = time.monotonic() + 6
while time.monotonic() < end:
    t1 = time.monotonic()
    while time.monotonic() - t1 < 0.02:
        a @ b
        torch.cuda.synchronize()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t1)))

phase[0] = "bf16 matmul continuously"
end = time.monotonic() + 5
while time.monotonic() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()

phase[0] = "idle, 9 GiB held"
time.sleep(3)
stop.set()
t.join()
del held

with open(os.path.join(out, "activity.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["t_s", "phase", "gpu_util_pct", "mem_copy_util_pct", "fb_used_mib", "sm_active_pct", "tensor_active_pct"])
    w.writerows(rows)
with open(os.path.join(out, "facts.json"), "w") as f:
    json.dump(facts, f, indent=2, sort_keys=True)
print(json.dumps(facts, indent=2, sort_keys=True))
by = {}
for r in rows:
    by.setdefault(r[1], []).append(r)
for p, rs in by.items():
    def med(i):
        v = sorted(x[i] for x in rs if x[i] != "")
        return v[len(v) // 2] if v else None
    print(f"{p}: n={len(rs)} gpu_util={med(2)} fb_used={med(4)} sm={med(5)} tensor={med(6)}")
