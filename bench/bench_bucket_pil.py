"""PIL baseline for bench_bucket.sh: Image.open(p).size on each file,
round-robin until at least --reads reads, one process. Prints the same
"reads N seconds S rate R" line as bench_imghdr."""
import sys
import time

from PIL import Image

args = sys.argv[1:]
target = 10000
if args[:1] == ["--reads"]:
    target = int(args[1])
    args = args[2:]
done = 0
total = 0
t0 = time.perf_counter()
while done < target:
    for p in args:
        with Image.open(p) as im:
            w, h = im.size
        total += w + h
        done += 1
dt = time.perf_counter() - t0
print("reads %d seconds %.3f rate %.0f bad 0 checksum %d" % (done, dt, done / dt, total))
