#!/usr/bin/env python3
"""Golden data for the CLIP tokenizer test (run by hand, not in CI).

Needs: pip install "transformers<5" ftfy tokenizers regex  (no torch), and the
open_clip_torch wheel (pip download open_clip_torch --no-deps -d DIR) for the
BPE file, since the HF hub is not reachable here.

  python3 tests/golden/make_tokenizer_golden.py DIR/open_clip_torch-*.whl

Writes tests/golden/tokenizer/{vocab.json.gz,merges.txt.gz,corpus.jsonl.gz}.
Each corpus line: {"text": str} or {"hex": bytes-as-hex} for invalid UTF-8,
"ids" (plain encode with BOS/EOS, no truncation), "pad_eos" and "pad0"
(padded/truncated to 77 with pad = EOS and pad = id 0), and flags:
"nofix": differs when ftfy is absent (BasicTokenizer path), "fast": the fast
(Rust) tokenizer differs, "mojibake": ftfy's fix_encoding step changes it.
"""
import gzip, io, json, os, random, sys, zipfile

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def build_vocab(wheel, d):
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("open_clip/bpe_simple_vocab_16e6.txt.gz")).decode("utf-8")
    merges = raw.split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in merges]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({v: i for i, v in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")


TAGS = """1girl 1boy solo long_hair short_hair blonde_hair black_hair brown_hair blue_eyes red_eyes green_eyes
smile open_mouth looking_at_viewer simple_background white_background upper_body full_body standing sitting
school_uniform serafuku thighhighs skirt dress hat bow ribbon gloves jewelry earrings necklace holding sword
outdoors indoors sky cloud tree flower cherry_blossoms night moon star_(sky) water beach ocean sunset
highres absurdres masterpiece best_quality ultra-detailed 8k photorealistic :d ;) ^_^ >_< o_o :3 x_x
hatsune_miku kagamine_rin touhou reimu_hakurei marisa_kirisame fate/grand_order artoria_pendragon_(fate)
animal_ears cat_ears fox_tail wings halo glasses hair_ornament hairclip twintails ponytail ahoge
score_9 score_8_up score_7_up rating:safe rating_explicit year_2023 no_humans scenery landscape
cowboy_shot from_above from_below dutch_angle depth_of_field bokeh chromatic_aberration film_grain""".split()

WORDS = """a an the photo picture painting drawing portrait of with and in on at by from under over near
cat dog woman man girl boy child old young city street forest mountain river lake house car bicycle train
red blue green yellow black white golden silver dark bright colorful beautiful detailed realistic
sitting standing running walking holding wearing looking smiling reading eating sleeping playing
table chair window door book cup coffee tea flowers garden park bridge castle tower sky clouds rain snow
sunlight shadows reflection style artstation trending cinematic lighting octane render unreal engine""".split()

UNI = ["café", "naïve", "résumé", "Ångström", "Zürich", "São Paulo", "niño", "façade", "Øresund", "łódź",
       "日本の桜", "東京タワー", "猫と犬", "中文字幕", "한국어 텍스트", "สวัสดี", "Привет мир", "Ελληνικά ΟΔΟΣ",
       "ΣΟΦΟΣ", "ΑΣ.Α", "مرحبا بالعالم", "שלום", "हिन्दी", "😀", "🐱‍👤", "👍🏽", "🇯🇵", "❤️", "★☆", "♪♫",
       "ﬁnest ﬂower", "ＬＯＵＤ　ＮＯＩＳＥＳ", "ｶﾀｶﾅ", "“curly” ‘quotes’", "İstanbul", "ſtraße", "ß", "Ǆemal",
       "x²", "½ cup", "①②③", "٣٤٥", "Ⅻ", "e\u0301", "A\u030a", "\u0345", "a\u00adb", "zero\u200bwidth",
       "bom\ufeffhere", "tab\there", "nbsp\u00a0here", "em\u2003space", "ideo\u3000space", "line\u2028sep",
       "nel\u0085x", "c1\u0080\u0093\u0094", "esc\x1b[31mred\x1b[0m", "ctrl\x01\x02\x07x", "nul\x00x", "del\x7fx",
       "\ufffd", "fs\x1cgs\x1dx", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "ｆｕｌｌ！", "Ⓐⓑ", "ℌℑ", "K", "Ω", "µ", "ﬅ", "ŉ"]

HTML = ["&amp;", "&lt;b&gt;", "&quot;hi&quot;", "&#39;s", "&#x27;t", "&#65;&#x42;", "&amp;amp;", "&nbsp;",
        "&copy; 2020", "&eacute;t&eacute;", "&NTILDE;", "&Eacute;", "&hellip;", "&mdash;", "&notanentity;",
        "&amp", "AT&T", "this&not that", "&#0;", "&#128;", "&#x110000;", "&#xD800;", "&#12abc;", "&#1;x",
        "<b>&amp;</b>", "a < b &amp; c", "&AMP;", "&lt;3", "&#9731;", "&#x1F600;", "&zwj;", "&shy;x"]

PUNCT = ["!!!", "???", "...", "!?!?", "--", "—", "~~~", "***", "###", "@@@", "$$$", "%%%", "^^^", "&&&",
         "(((masterpiece)))", "[[tag]]", "{a|b}", "<lora:foo:0.8>", "a,b,c", "a, b, c", "x:1.2", "((((((",
         "'''", "\"\"\"", "`code`", "a/b\\c", "a_b-c.d", "1.5", "3,000", "-42", "+7", "100%", "#1", "v2.1",
         "<|startoftext|>", "<|endoftext|>", "a<|endoftext|>b", "!<|endoftext|>", "<|ENDOFTEXT|>", "<|endoftext|"]

CONTR = ["it's", "don't", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "DON'T", "Y'ALL", "rock'n'roll",
         "'s", "''s", "o'clock", "can't", "won't", "ma'am", "'tis", "'d've", "it’s", "it ʼs", "'ſ"]


def rnd_caption(r):
    k = r.randrange(9)
    if k == 0:
        return ", ".join(r.sample(TAGS, r.randint(3, 25)))
    if k == 1:
        return " ".join(t.replace("_", " ") for t in r.sample(TAGS, r.randint(3, 20)))
    if k == 2:
        s = " ".join(r.choice(WORDS) for _ in range(r.randint(3, 30)))
        return s[0].upper() + s[1:] + r.choice([".", "", "!", "?", "..."])
    if k == 3:
        return " ".join(r.choice(WORDS + UNI) for _ in range(r.randint(1, 12)))
    if k == 4:
        return " ".join(r.choice(WORDS + HTML) for _ in range(r.randint(1, 10)))
    if k == 5:
        ws = [" ", "  ", "\t", "\n", "\r\n", " \u00a0 ", "\u3000", "\u2009", "\u200b"]
        return r.choice(["", " ", "\n"]) + r.choice(ws).join(r.choice(WORDS + TAGS) for _ in range(r.randint(1, 12))) + r.choice(["", " ", "\n\n"])
    if k == 6:
        return " ".join(r.choice(WORDS + CONTR + PUNCT) for _ in range(r.randint(1, 15)))
    if k == 7:
        return " ".join(str(r.choice([r.randint(0, 10**r.randint(1, 12)), r.random() * 1000, r.randint(-99, 99)])) + r.choice(["", "px", "k", "x", " years"]) for _ in range(r.randint(1, 6)))
    # very long
    return ", ".join(r.choice(TAGS + WORDS) for _ in range(r.randint(60, 250)))


def corpus():
    r = random.Random(6)
    out = [""] + UNI + HTML + PUNCT + CONTR + ["a photo of a cat", "A PHOTO OF A CAT", "   ", "\n\t"]
    mix = UNI + HTML + PUNCT + CONTR
    while len(out) < 2300:
        c = rnd_caption(r)
        if r.random() < 0.15:
            c = c + " " + r.choice(mix)
        out.append(c)
    inval = [b"caf\xe9", b"\xff\xfe", b"ok \xc3", b"\xe2\x82", b"a\xed\xa0\x80b", b"\xf4\x90\x80\x80x", b"\xc0\xaf",
             b"\xf0\x9f\x98", b"tag1, \x80tag2", b"\xe6\x97\xa5\xe6\x9c\xac\xff"]
    return out, inval


def main():
    wheel = sys.argv[1]
    import ftfy
    from transformers import CLIPTokenizer, CLIPTokenizerFast
    import transformers.models.clip.tokenization_clip as tc
    tmp = "/tmp/sdtk_tok_golden"
    build_vocab(wheel, tmp)
    vf, mf = os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt")
    tok = CLIPTokenizer(vf, mf)
    tok0 = CLIPTokenizer(vf, mf, pad_token="!")
    assert tok0.pad_token_id == 0
    assert tok("a photo of a cat").input_ids == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert tok("hello world").input_ids == [49406, 3306, 1002, 49407]
    fast = CLIPTokenizerFast(vf, mf)
    # The path transformers takes without ftfy: force it by hiding the module.
    saved = sys.modules.get("ftfy")
    sys.modules["ftfy"] = None
    nofix = CLIPTokenizer(vf, mf)
    sys.modules["ftfy"] = saved
    assert nofix.fix_text is None and tok.fix_text is not None
    texts, inval = corpus()
    lines = []
    counts = {"nofix": 0, "fast": 0, "mojibake": 0}
    for t in [(x, None) for x in texts] + [(b.decode("utf-8", errors="replace"), b) for b in inval]:
        text, raw = t
        rec = {"hex": raw.hex()} if raw is not None else {"text": text}
        ids = tok(text).input_ids
        rec["ids"] = ids
        rec["pad_eos"] = tok(text, padding="max_length", max_length=77, truncation=True).input_ids
        rec["pad0"] = tok0(text, padding="max_length", max_length=77, truncation=True).input_ids
        for name, other in (("nofix", nofix), ("fast", fast)):
            if other(text).input_ids != ids:
                rec[name] = True
                counts[name] += 1
        if ftfy.fix_text(text) != ftfy.fix_text(text, fix_encoding=False):
            rec["mojibake"] = True
            counts["mojibake"] += 1
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    os.makedirs(OUT, exist_ok=True)
    for name, src in (("vocab.json", vf), ("merges.txt", mf)):
        with open(src, "rb") as f, gzip.GzipFile(os.path.join(OUT, name + ".gz"), "wb", mtime=0) as g:
            g.write(f.read())
    with gzip.GzipFile(os.path.join(OUT, "corpus.jsonl.gz"), "wb", mtime=0) as g:
        g.write(("\n".join(lines) + "\n").encode("utf-8"))
    print(f"{len(lines)} captions; differ without ftfy: {counts['nofix']}, fast differs: {counts['fast']}, "
          f"ftfy fix_encoding changes: {counts['mojibake']}")


if __name__ == "__main__":
    main()
