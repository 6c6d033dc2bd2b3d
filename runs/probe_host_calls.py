"""Host cost of the CUDA calls a constrained public-API call makes around its graph's launch.

    python runs/probe_host_calls.py        (on a GPU)

Each row is the median host time of one operation, in µs, over 2,000 calls with the device
idle (synchronised before each): the non-blocking copy of a pinned block into a device block
(the lists' staging), an event's record and synchronise (the pinned block's guard), the current
stream's lookup, a small tensor's clone (the decode's outputs) and its copy to the host.
"""
import statistics
import time

import torch


def host_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def main() -> None:
    dev = torch.device("cuda")
    host = torch.zeros(1 << 20, dtype=torch.int64, pin_memory=True)
    block = torch.zeros(1 << 20, dtype=torch.int64, device=dev)
    event = torch.cuda.Event(external=True)
    plain = torch.cuda.Event()
    stream = torch.cuda.current_stream()
    out = torch.zeros(128, 5, dtype=torch.int64, device=dev)
    event.record()
    rows = {
        "copy_ 103 int64, pinned -> device, non_blocking": lambda: block[:103].copy_(host[:103], non_blocking=True),
        "copy_ 16,387 int64, pinned -> device, non_blocking": lambda: block[:16387].copy_(host[:16387], non_blocking=True),
        "host[:103] slice": lambda: host[:103],
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "external event .record()": event.record,
        "external event .record(stream)": lambda: event.record(stream),
        "event .record()": plain.record,
        "completed external event .synchronize()": event.synchronize,
        "completed external event .query()": event.query,
        "clone of (128, 5) int64": out.clone,
        "(128, 5) int64 .cpu()": out.cpu,
        "copy_ + record (the staging's guard)": lambda: (block[:103].copy_(host[:103], non_blocking=True),
                                                         event.record()),
    }
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name, fn in rows.items():
        print(f"{host_us(fn):8.2f} us  {name}", flush=True)


if __name__ == "__main__":
    main()
