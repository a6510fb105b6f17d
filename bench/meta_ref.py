#!/usr/bin/env python3
"""Reference implementation of sd-meta's booru (Danbooru) path in plain Python,
for the benchmark: same filters in the same order, same tag rewrites, same
caption template and split, same JSONL record. Written the way a careful
Python script would be (json.loads per line, dicts and str methods), so the
speed comparison with sd-meta is fair. Supports the rule keys the benchmark
rules use (no tag shuffle, no escape_parens, no e621 posts).

Usage: meta_ref.py RULES.json POSTS.jsonl OUT.jsonl [IMAGE_PATTERN]
"""
import ctypes
import ctypes.util
import json
import re
import sys

CATS = ["general", "artist", "copyright", "character", "species", "meta", "lore", "invalid"]
DANBOORU_FIELDS = [("tag_string_artist", 1), ("tag_string_copyright", 2), ("tag_string_character", 3),
                   ("tag_string_general", 0), ("tag_string_meta", 5)]
RATINGS = {"g": "general", "s": "sensitive", "q": "questionable", "e": "explicit"}
CONSUMED = {"id", "md5", "file_ext", "rating", "score", "image_width", "image_height", "tag_string",
            "tag_string_general", "tag_string_artist", "tag_string_copyright", "tag_string_character",
            "tag_string_meta", "tag_count", "tag_count_general", "tag_count_artist", "tag_count_copyright",
            "tag_count_character", "tag_count_meta"}
NORM = {**{c: c + 32 for c in range(65, 91)}, ord("_"): " "}
OPS = [("<=", lambda a, b: a <= b), (">=", lambda a, b: a >= b), ("==", lambda a, b: a == b),
       ("!=", lambda a, b: a != b), ("<", lambda a, b: a < b), (">", lambda a, b: a > b), ("=", lambda a, b: a == b)]

_xxh = ctypes.CDLL(ctypes.util.find_library("xxhash")).XXH3_64bits_withSeed
_xxh.restype = ctypes.c_uint64
_xxh.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]


def hash_unit(key, seed):
    b = key.encode()
    return (_xxh(b, len(b), seed) >> 11) * (1.0 / 9007199254740992.0)


def norm(tag):
    """ASCII lower-case with '_' as ' '; tags of 512+ bytes match nothing."""
    if len(tag) >= 512 or len(tag.encode()) >= 512:
        return None
    return tag.translate(NORM)


def num(v):
    """sd_json_num: a number, or a string holding one."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str) and v:
        try:
            return float(v)
        except ValueError:
            return None
    return None


def json_num(d):
    """sd_buf_json_num: integers exactly, others shortest round-trip."""
    if d == int(d) and abs(d) < 9e15:
        return int(d)
    return d


class Rules:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        for k in j:
            if k in ("shuffle_tag_p", "escape_parens", "keep_tokens") and j[k]:
                sys.exit(f"meta_ref.py: rule '{k}' not implemented")
        self.blacklist = {norm(t) for t in j.get("blacklist_tags", [])}
        self.ratings = {norm(t) for t in j.get("ratings", [])}
        self.abs_min = j.get("abs_min_score")
        self.min_score = j.get("min_score")
        self.bonus = {norm(k): v for k, v in j.get("tag_bonus_scores", {}).items()}
        self.where = [self.parse_where(e) for e in j.get("where", [])]
        self.min_side = int(j.get("min_side", 0))
        self.min_pixels = int(j.get("min_pixels", 0))
        self.underscores = j.get("underscores", True)
        self.replace = {norm(k): v for k, v in j.get("replace_tags", {}).items()}
        self.subst = list(j.get("replace_substrings", {}).items())
        self.non_caption = {norm(t) for t in j.get("non_caption_tags", [])}
        self.score_tags = sorted(j.get("score_tags", []), reverse=True)
        self.score_prefix = j.get("score_tag_prefix", "scr")
        order = j.get("tag_order", ["character", "copyright", "artist", "species", "general", "lore", "meta"])
        self.order = [CATS.index(c) for c in order]
        self.rating_words = j.get("rating_words", {})
        self.artist_prefix = j.get("artist_prefix", "")
        self.template = j.get("caption_template", "{caption}, {score_tag}, {tags}")
        self.sep = j.get("tag_separator", ", ")
        self.seed = int(j.get("seed", 0))
        self.val_every = int(j.get("val_every", 0))
        self.val_fraction = j.get("val_fraction", 0)
        self.tmpl = re.findall(r"\{([^{}]*)\}|([^{]+|\{[^}]*$)", self.template)

    @staticmethod
    def parse_where(expr):
        for i in range(len(expr)):
            for op, fn in OPS:
                if expr.startswith(op, i):
                    field, val = expr[:i].strip(" "), expr[i + len(op):].strip(" ")
                    if len(val) >= 2 and val[0] in "\"'" and val[-1] == val[0]:
                        return field, fn, val[1:-1], False, expr
                    try:
                        return field, fn, float(val), True, expr
                    except ValueError:
                        return field, fn, val, False, expr
        raise ValueError(expr)


def field_path(obj, path):
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def image_path(pattern, post):
    """sd_pattern_format for {field}, {field%N}, {field:0Nd}; None if a field is missing."""
    out = []
    for m in re.finditer(r"\{([^}%:]*)(?:%(\d+))?(?::0?(\d+)d?)?\}|([^{]+)", pattern):
        if m.group(4) is not None:
            out.append(m.group(4))
            continue
        name, mod, width = m.group(1), int(m.group(2) or 0), int(m.group(3) or 0)
        v = field_path(post, name)
        if v is None and name == "ext":
            v = post.get("file_ext", field_path(post, "file.ext"))
        if v is None or isinstance(v, (bool, dict, list)):
            return None
        if isinstance(v, (int, float)) or mod or width:
            d = num(v)
            if d is None or not -9e18 < d < 9e18:
                return None
            iv = int(d)
            if mod:
                iv = iv - mod * int(iv / mod)  # C remainder
            out.append("%0*d" % (width, iv))
        else:
            out.append(v)
    return "".join(out)


def split_tags(s, sep, cat, tags):
    if sep == " ":
        s = s.replace("\t", " ").replace("\n", " ")
        strip = " \t\n\r"
    else:
        strip = " \t\n\r"
    for t in s.split(sep):
        t = t.strip(strip)
        if t:
            tags.append([t, cat])


def process(line, ordinal, rules, pattern):
    """One post: (record dict, None) or (None, reason)."""
    try:
        post = json.loads(line)
    except ValueError:
        return None, "malformed JSON"
    if not isinstance(post, dict):
        return None, "record is not a JSON object"
    tags = []
    found = False
    for field, cat in DANBOORU_FIELDS:
        v = post.get(field)
        if isinstance(v, str):
            split_tags(v, " ", cat, tags)
            found = True
    if not found:
        v = post.get("tag_string")
        if isinstance(v, str):
            split_tags(v, "," if "," in v else " ", 0, tags)
    rt = post.get("rating")
    rating = RATINGS.get(rt) if isinstance(rt, str) else None
    score = num(post.get("score"))
    w, h = num(post.get("image_width")), num(post.get("image_height"))
    w = int(w) if w is not None and 1 <= w <= 1e9 else 0
    h = int(h) if h is not None and 1 <= h <= 1e9 else 0
    key = None
    for k in ("id", "md5"):
        v = post.get(k)
        if isinstance(v, str) and v or isinstance(v, (int, float)) and not isinstance(v, bool):
            key = str(v)
            break
    if key is None:
        return None, "post has no id or md5"
    image = image_path(pattern, post) if pattern else None
    if pattern and image is None:
        return None, "image pattern field missing"
    # filters
    if rules.ratings and (rating is None or rating not in rules.ratings):
        return None, "rating not allowed"
    if rules.abs_min is not None:
        if score is None:
            return None, "no score"
        if score < rules.abs_min:
            return None, "score below abs_min_score"
    for field, fn, val, is_num, expr in rules.where:
        if is_num:
            if field == "score":
                v = score
            elif field == "width" and w:
                v = w
            elif field == "height" and h:
                v = h
            else:
                v = num(field_path(post, field))
        else:
            v = rating if field == "rating" else key if field == "key" else field_path(post, field)
            v = v if isinstance(v, str) else None
        if v is None:
            return None, "where " + expr + ": field missing"
        if not fn(v, val):
            return None, "where " + expr
    if w and h:
        if rules.min_side and (w < rules.min_side or h < rules.min_side):
            return None, "below min_side"
        if rules.min_pixels and w * h < rules.min_pixels:
            return None, "below min_pixels"
    normed = [norm(t[0]) for t in tags]
    if rules.blacklist and any(n in rules.blacklist for n in normed):
        return None, "blacklisted tag"
    if rules.bonus or rules.min_score is not None:
        bonus = sum(rules.bonus.get(n, 0) for n in normed) if rules.bonus else 0
        if score is not None:
            score += bonus
        if rules.min_score is not None:
            if score is None:
                return None, "no score"
            if score < rules.min_score:
                return None, "score below min_score"
    # tag rewrites
    for t, n in zip(tags, normed):
        s = t[0]
        rep = rules.replace.get(n) if rules.replace else None
        if rep is not None:
            if not rep:
                t[0] = None
                continue
            s = rep
        if rules.underscores and len(s.encode()) > 3:
            s = s.replace("_", " ")
        for a, b in rules.subst:
            s = s.replace(a, b)
        t[0] = s or None
    # caption
    parts = []
    for var, text in rules.tmpl:
        if text:
            parts.append(text)
        elif var == "caption":
            pass
        elif var == "tags" or var in CATS:
            only = CATS.index(var) if var in CATS else -1
            items = []
            for c in rules.order:
                if only >= 0 and c != only:
                    continue
                for s, cat in tags:
                    if cat != c or s is None:
                        continue
                    if rules.non_caption and norm(s) in rules.non_caption:
                        continue
                    items.append(rules.artist_prefix + s if c == 1 else s)
            parts.append(rules.sep.join(items))
        elif var == "rating":
            if rating:
                parts.append(rules.rating_words.get(rating, rating))
        elif var == "score_tag":
            if score is not None:
                for th in rules.score_tags:
                    if score >= th:
                        parts.append(rules.score_prefix + str(json_num(th)))
                        break
        else:
            parts.append("{" + var + "}")
    caption = ",".join(p for p in "".join(parts).split(",") if p.strip(" \t")).strip(" \t")
    split = "train"
    if rules.val_every > 0 and (ordinal + 1) % rules.val_every == 0:
        split = "val"
    if rules.val_fraction > 0 and hash_unit(key, rules.seed ^ 0x76616C69) < rules.val_fraction:
        split = "val"
    rec = {"v": 1, "key": key}
    if image is not None:
        rec["image"] = image
    if w > 0 and h > 0:
        rec["width"] = w
        rec["height"] = h
    rec["caption"] = caption
    by_cat = {}
    for s, cat in tags:
        if s is not None:
            by_cat.setdefault(CATS[cat], []).append(s)
    if by_cat:
        rec["tags"] = {c: by_cat[c] for c in CATS if c in by_cat}
    if score is not None:
        rec["score"] = json_num(score)
    if rating:
        rec["rating"] = rating
    rec["split"] = split
    extra = {k: v for k, v in post.items() if k not in CONSUMED}
    if extra:
        rec["extra"] = extra
    return rec, None


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: meta_ref.py RULES.json POSTS.jsonl OUT.jsonl [IMAGE_PATTERN]")
    rules = Rules(sys.argv[1])
    pattern = sys.argv[4] if len(sys.argv) > 4 else None
    seen = set()
    skipped = {}
    read = written = 0
    with open(sys.argv[2], encoding="utf-8") as f, open(sys.argv[3], "w", encoding="utf-8") as out:
        for line in f:
            if line == "\n":
                continue
            rec, reason = process(line, read, rules, pattern)
            read += 1
            if rec is not None and rec["key"] in seen:
                rec, reason = None, "duplicate key"
            if rec is None:
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            seen.add(rec["key"])
            out.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
            out.write("\n")
            written += 1
    print(f"meta_ref: records read {read}, written {written}, skipped {read - written}", file=sys.stderr)
    for r, n in sorted(skipped.items(), key=lambda x: -x[1]):
        print(f"meta_ref:   {r}: {n}", file=sys.stderr)


if __name__ == "__main__":
    main()
