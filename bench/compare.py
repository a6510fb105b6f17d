#!/usr/bin/env python3
"""Compare sd-meta's JSONL with meta_ref.py's: same kept keys in the same
order, and per record the same caption, split, tags, score and the rest.
Usage: compare.py SDMETA.jsonl REF.jsonl  (exit 1 on any mismatch)"""
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    ka, kb = [r["key"] for r in a], [r["key"] for r in b]
    bad = 0
    if set(ka) != set(kb):
        only_a, only_b = sorted(set(ka) - set(kb)), sorted(set(kb) - set(ka))
        print(f"kept keys differ: {len(only_a)} only in sd-meta {only_a[:5]}, {len(only_b)} only in ref {only_b[:5]}")
        bad += 1
    elif ka != kb:
        print("same kept keys but in a different order")
        bad += 1
    rb = {r["key"]: r for r in b}
    fields = {}
    for r in a:
        o = rb.get(r["key"])
        if o is None:
            continue
        for k in set(r) | set(o):
            if r.get(k) != o.get(k):
                fields[k] = fields.get(k, 0) + 1
                if fields[k] <= 2:
                    print(f"key {r['key']}: field '{k}' differs:\n  sd-meta: {r.get(k)!r}\n  ref:     {o.get(k)!r}")
    for k, n in fields.items():
        print(f"field '{k}' differs in {n} records")
        bad += 1
    print(f"compare: {len(a)} records from sd-meta, {len(b)} from the reference: "
          + ("MATCH" if not bad else "MISMATCH"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
