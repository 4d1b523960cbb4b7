# Run on the device machine after call5.sh's runs (same host): where a 9.4 GB checkpoint write's host time goes,
# without ptrain: 8 threads each write 1.2 GB from pinned host memory into a file of its own in /dev/shm, in
# 64 MiB chunks, with and without a CRC-32 of each chunk (zlib, as ptrain's writer); then the 8 files are removed
# (what --keep-checkpoints 1 does to the previous checkpoint); then one thread's memcpy of 1 GiB.
import os, time, threading, zlib, torch
PART, CHUNK, N = 1200 << 20, 64 << 20, 8
host = torch.empty(N * PART, dtype=torch.uint8, pin_memory=True)
host.random_(0, 255)
buf = memoryview(host.numpy())
def write_parts(label, crc):
    fds = [os.open(f"/dev/shm/probe{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for i in range(N)]
    times = [0.0] * N
    def part(i):
        t = time.time()
        for off in range(0, PART, CHUNK):
            chunk = buf[i * PART + off:i * PART + off + CHUNK]
            if crc: zlib.crc32(chunk)
            os.pwrite(fds[i], chunk, off)
        times[i] = time.time() - t
    t = time.time()
    threads = [threading.Thread(target=part, args=(i,)) for i in range(N)]
    for th in threads: th.start()
    for th in threads: th.join()
    wall = time.time() - t
    for fd in fds: os.close(fd)
    print(f"{label}: {N * PART / 1e9:.1f} GB in {wall:.2f} s = {N * PART / 1e9 / wall:.1f} GB/s; parts {min(times):.2f}-{max(times):.2f} s", flush=True)
    t = time.time()
    for i in range(N): os.unlink(f"/dev/shm/probe{i}")
    print(f"  removing the 8 files: {time.time() - t:.2f} s", flush=True)
for rep in range(2):
    write_parts("8 threads, 8 files, CRC + pwrite", True)
    write_parts("8 threads, 8 files, pwrite only", False)
t = time.time(); [zlib.crc32(buf[i * CHUNK:(i + 1) * CHUNK]) for i in range(16)]; dt = time.time() - t
print(f"1 thread CRC-32: {16 * CHUNK / 1e9 / dt:.2f} GB/s")
dst = torch.empty(1 << 30, dtype=torch.uint8)
t = time.time(); dst.copy_(host[:1 << 30]); dt = time.time() - t
print(f"1 thread memcpy (torch copy_, may use several threads): {1.07 / dt:.1f} GB/s")
