#!/usr/bin/env python3
"""Summarise and check the example training run from sd-train --metrics
files: the mean loss of the first and of the last N steps (the loss must
fall by at least a fifth), and the reload check: the last checkpoint, loaded
back and run with lr 0 on the same seed (so on the same samples, timesteps
and noise as training steps 1..K), must give a loss clearly below that of
the untrained model on those same draws. A resumed run may append a step
twice: the last line of each step counts. Exit 0 ok, 1 check failed.
Usage: train-summary.py TRAIN_METRICS RELOAD_METRICS N"""
import json
import sys


def losses(path):
    by_step = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                by_step[r["step"]] = r["loss"]
    return [by_step[s] for s in sorted(by_step)]


def mean(xs):
    return sum(xs) / len(xs)


def main():
    train, reload, n = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
    steps, k = len(train), len(reload)
    if steps < 2 * n or k == 0 or k > steps:
        print("train-summary: need %d+ training steps and 1..%d reload steps, got %d and %d" % (2 * n, steps, steps, k))
        return 1
    first, last = mean(train[:n]), mean(train[-n:])
    init, loaded = mean(train[:k]), mean(reload)
    print("training loss: mean of steps 1-%d %.4f, of steps %d-%d %.4f (x%.2f)" % (n, first, steps - n + 1, steps, last,
                                                                                 last / first))
    print("checkpoint-%d loaded back: loss %.4f on the draws of steps 1-%d (the untrained model: %.4f)" % (
        steps, loaded, k, init))
    ok = True
    if not last < 0.8 * first:
        print("train-summary: FAILED: the loss did not fall by a fifth")
        ok = False
    if not loaded < 0.8 * init:
        print("train-summary: FAILED: the reloaded checkpoint is no better than the untrained model")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
