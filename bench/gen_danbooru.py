#!/usr/bin/env python3
"""Deterministic generator of Danbooru-like posts for benchmarking sd-meta.

Usage: gen_danbooru.py N OUT.jsonl [SEED]

Each line is one post with the field set of the Danbooru posts API (id,
created_at, uploader_id, score, up/down_score, fav_count, rating g/s/q/e, md5,
image size, tag_string and the per-category tag strings and counts, file
URLs, pixiv_id, a media_asset, ...), compact like the API, about 2.4 KB. General
tags (25-35 per post) are drawn from a Zipf-like vocabulary of a few thousand
tags. About 1% of the lines have a problem: truncated JSON, or no id (some
also without md5).
"""
import bisect
import hashlib
import itertools
import json
import random
import sys

COLORS = ["black", "blue", "brown", "green", "grey", "orange", "pink", "purple", "red", "white", "yellow",
          "aqua", "blonde", "silver", "multicolored", "two-tone", "light_brown", "dark_blue"]
PARTS = ["hair", "eyes", "shirt", "skirt", "dress", "jacket", "gloves", "thighhighs", "bow", "ribbon", "hat",
         "footwear", "nails", "background", "bikini", "kimono", "scarf", "sleeves", "headwear", "pantyhose"]
ACTS = ["looking_at_viewer", "smile", "open_mouth", "blush", "closed_eyes", "standing", "sitting", "holding",
        "outdoors", "indoors", "simple_background", "upper_body", "full_body", "cowboy_shot", "from_side",
        "from_behind", "parted_lips", "closed_mouth", "hand_up", "arms_up", "one_eye_closed", ":d", ";)",
        "^_^", "o_o", "v", "solo_focus", "multiple_girls", "2girls", "1boy", "day", "night", "sky", "cloud"]
VERBS = ["holding", "wearing", "looking_at", "hand_on", "pointing_at", "reaching_for", "sitting_on", "leaning_on"]
NOUNS = ["sword", "umbrella", "flower", "book", "cup", "phone", "bag", "weapon", "staff", "gun", "food",
         "animal", "plate", "fan", "instrument", "microphone", "camera", "card", "lantern", "balloon"]
EXTRA = ["1girl", "solo", "long_hair", "short_hair", "breasts", "masterpiece", "official_art", "sketch",
         "lowres", "monochrome", "greyscale", "comic", "4koma", "text_focus", "watermark", "web_address",
         "jpeg_artifacts", "bad_anatomy", "guro", "blood", "scat", "vore", "character_name", "artist_name",
         "signature", "speech_bubble", "english_text", "photo_(medium)", "3d", "ai-generated"]
SYL = ["ka", "ri", "mi", "to", "su", "na", "ha", "ya", "ko", "ne", "shi", "ra", "no", "yu", "ki", "mo", "sa", "ta"]
META = ["highres", "absurdres", "commentary_request", "translated", "commentary", "english_commentary",
        "bad_id", "bad_pixiv_id", "revision", "check_translation", "animated", "tagme", "md5_mismatch"]


def make_vocab(rng):
    """General tags, most frequent first, plus character/copyright/artist pools."""
    tags = list(EXTRA[:6]) + ACTS
    tags += [f"{c}_{p}" for c, p in itertools.product(COLORS, PARTS)]
    tags += [f"{v}_{n}" for v, n in itertools.product(VERBS, NOUNS)]
    tags += [f"{p}_({q})" for p, q in itertools.product(PARTS, ["cosplay", "object", "clothing", "pattern"])]
    seen = set(tags)
    while len(tags) < 3400:
        w = "_".join("".join(rng.choice(SYL) for _ in range(rng.randint(2, 3))) for _ in range(rng.randint(1, 2)))
        if w not in seen:
            seen.add(w)
            tags.append(w)
    head = tags[6:400]
    rng.shuffle(head)  # realistic tags first, made-up words in the long tail
    tags = tags[:6] + head + tags[400:]
    # the rarer or blacklisted extras go at mid ranks so they show up a few % of the time
    for i, t in enumerate(EXTRA[6:]):
        tags.insert(40 + i * 40, t)
    series = ["_".join(rng.choice(SYL) + rng.choice(SYL) for _ in range(rng.randint(1, 3))) for _ in range(220)]
    series += ["vocaloid", "touhou", "kantai_collection", "fate/grand_order", "genshin_impact", "original"]
    chars = []
    for i in range(700):
        name = rng.choice(SYL).join(rng.choice(SYL) for _ in range(2)) + "_" + "".join(rng.choice(SYL) for _ in range(3))
        s = rng.choice(series)
        chars.append((name + f"_({s})" if i % 3 == 0 else name, s))
    artists = ["".join(rng.choice(SYL) for _ in range(rng.randint(2, 5))) + ("_(artist)" if i % 9 == 0 else "")
               for i in range(2500)]
    return tags, chars, series, artists


def zipf_cum(n, s):
    acc, out = 0.0, []
    for r in range(1, n + 1):
        acc += 1.0 / r ** s
        out.append(acc)
    return out


def pick(rng, items, cum, k):
    """k distinct items drawn by the cumulative weights."""
    got, total = {}, cum[-1]
    while len(got) < k:
        i = bisect.bisect(cum, rng.random() * total)
        got[min(i, len(items) - 1)] = None
    return [items[i] for i in got]


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: gen_danbooru.py N OUT.jsonl [SEED]")
    n, out, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1
    rng = random.Random(seed)
    tags, chars, series, artists = make_vocab(rng)
    tcum, ccum, acum = zipf_cum(len(tags), 1.0), zipf_cum(len(chars), 0.9), zipf_cum(len(artists), 0.8)
    post_id = 1000000
    t0 = 1420070400
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            post_id += rng.randint(1, 4)
            t = t0 + post_id * 97 % 300000000
            md5 = hashlib.md5(b"%d" % post_id).hexdigest()
            ext = rng.choices(["jpg", "png", "gif", "webp", "mp4"], [70, 24, 2, 3, 1])[0]
            w = rng.choice([600, 768, 850, 1000, 1200, 1448, 1600, 2048, 2894, 4096])
            h = int(w * rng.choice([0.5625, 0.75, 1.0, 1.333, 1.414, 1.5, 1.777]))
            general = pick(rng, tags, tcum, rng.randint(25, 35))
            nchar = rng.choices([0, 1, 2, 3], [25, 55, 15, 5])[0]
            ch = pick(rng, chars, ccum, nchar) if nchar else []
            copy = list(dict.fromkeys(s for _, s in ch)) or (["original"] if rng.random() < 0.5 else [])
            art = pick(rng, artists, acum, rng.choices([0, 1, 2], [8, 88, 4])[0] or 1)
            if rng.random() < 0.05:
                art = []
            meta = [m for m in META if rng.random() < (0.6 if m in ("highres", "commentary_request") else 0.05)]
            up = int(rng.paretovariate(1.3) * 4) - 1
            down = -int(rng.expovariate(1.5))
            score = up + down
            fav = max(0, int(score * rng.uniform(0.8, 1.6)) - rng.randint(0, 3))
            rating = rng.choices("gsqe", [45, 30, 15, 10])[0]
            cdn = f"https://cdn.donmai.us/original/{md5[:2]}/{md5[2:4]}/{md5}.{ext}"
            ts = lambda x: "%04d-%02d-%02dT%02d:%02d:%02d.%03d-05:00" % (
                2015 + x // 31536000 % 10, 1 + x // 2592000 % 12, 1 + x // 86400 % 28, x // 3600 % 24,
                x // 60 % 60, x % 60, x % 1000)
            general_s = " ".join(general)
            post = {
                "id": post_id, "created_at": ts(t), "uploader_id": 10000 + post_id * 7 % 900000,
                "score": score, "source": f"https://i.pximg.net/img-original/img/{post_id % 97}/{post_id}_p0.{ext}",
                "md5": md5, "last_comment_bumped_at": None, "rating": rating,
                "image_width": w, "image_height": h,
                "tag_string": " ".join(sorted(general + [c for c, _ in ch] + copy + art + meta)),
                "fav_count": fav, "file_ext": ext, "last_noted_at": None, "parent_id": None if i % 11 else post_id - 3,
                "has_children": i % 17 == 0, "approver_id": None if i % 3 else 500 + i % 40,
                "tag_count_general": len(general), "tag_count_artist": len(art),
                "tag_count_character": len(ch), "tag_count_copyright": len(copy),
                "file_size": w * h // 5 + post_id % 9999, "up_score": up, "down_score": down,
                "is_pending": False, "is_flagged": False, "is_deleted": i % 53 == 0,
                "tag_count": len(general) + len(ch) + len(copy) + len(art) + len(meta),
                "updated_at": ts(t + 5000), "is_banned": False, "pixiv_id": post_id * 3 + 17 if i % 4 else None,
                "last_commented_at": None, "has_active_children": i % 17 == 0, "bit_flags": 0,
                "tag_count_meta": len(meta), "has_large": w > 850, "has_visible_children": False,
                "media_asset": {
                    "id": post_id + 5000000, "created_at": ts(t), "updated_at": ts(t + 10),
                    "md5": md5, "file_ext": ext, "file_size": w * h // 5, "image_width": w, "image_height": h,
                    "duration": None, "status": "active", "file_key": md5[5:14], "is_public": True,
                    "pixel_hash": md5[::-1]},
                "tag_string_general": general_s,
                "tag_string_character": " ".join(c for c, _ in ch),
                "tag_string_copyright": " ".join(copy),
                "tag_string_artist": " ".join(art),
                "tag_string_meta": " ".join(meta),
                "file_url": cdn,
                "large_file_url": cdn if w <= 850 else f"https://cdn.donmai.us/sample/{md5[:2]}/{md5[2:4]}/sample-{md5}.jpg",
                "preview_file_url": f"https://cdn.donmai.us/180x180/{md5[:2]}/{md5[2:4]}/{md5}.jpg",
            }
            fault = rng.random()
            if fault < 0.004:
                line = json.dumps(post, separators=(",", ":"))
                line = line[: rng.randint(10, len(line) - 2)]
            else:
                if fault < 0.007:
                    del post["id"]
                elif fault < 0.010:
                    del post["id"]
                    del post["md5"]
                line = json.dumps(post, separators=(",", ":"))
            f.write(line)
            f.write("\n")


if __name__ == "__main__":
    main()
