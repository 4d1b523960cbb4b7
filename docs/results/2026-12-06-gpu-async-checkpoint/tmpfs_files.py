# Run on the device machine right after call4.sh (same H200 host): how fast /dev/shm takes 4 GiB written as one
# file from one thread, as one file from 8 threads (pwrite at their offsets), and as 8 files from 8 threads.
import os, time, threading
chunk = os.urandom(1<<20) * 512   # 512 MiB
N = 8
def run(label, files, threads):
    fds = [os.open(f"/dev/shm/t{i}", os.O_WRONLY|os.O_CREAT|os.O_TRUNC) for i in range(files)]
    t = time.time()
    def w(k):
        fd = fds[k % files]
        off = (k // files) * len(chunk) if files > 1 else k * len(chunk)
        os.pwrite(fd, chunk, off)
    ths = [threading.Thread(target=w, args=(k,)) for k in range(N)]
    if threads == 1:
        for k in range(N): w(k)
    else:
        for th in ths: th.start()
        for th in ths: th.join()
    dt = time.time() - t
    for fd in fds: os.close(fd)
    for i in range(files): os.unlink(f"/dev/shm/t{i}")
    print(f"{label}: 4 GiB in {dt:.2f} s = {4/dt:.2f} GiB/s", flush=True)
for rep in range(2):
    run("1 thread, 1 file", 1, 1)
    run("8 threads, 1 file", 1, 8)
    run("8 threads, 8 files", 8, 8)
