/* libcore and formats helpers: thread pool slicing, block line reader,
 * UTF-8 checks, hash sets and maps, brace expansion, image-path patterns,
 * config/--set expansion of option words, progress lines. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cli.h"
#include "dtoa.h"
#include "hash.h"
#include "keyset.h"
#include "lines.h"
#include "pool.h"
#include "progress.h"
#include "rules.h"
#include "source.h"
#include "sources.h"
#include "strmap.h"
#include "utf8.h"

/* Each worker marks the items of its slice. */
static void mark(void *ctx, int w, size_t b, size_t e)
{
    int *v = ctx;
    for (size_t i = b; i < e; i++) v[i] += 1 + w * 0;
}

/* Every item is visited exactly once whatever the pool size and n. */
static void test_pool(void)
{
    for (int t = 1; t <= 4; t++) {
        sd_pool *p = sd_pool_create(t);
        for (size_t n = 0; n < 50; n += 7) {
            int v[64] = {0};
            sd_pool_for(p, n, mark, v);
            int ok = 1;
            for (size_t i = 0; i < 64; i++) ok &= v[i] == (i < n ? 1 : 0);
            CHECK(ok);
        }
        sd_pool_destroy(p);
    }
    /* the memory limit: known here, and never above the machine's */
    size_t mem = sd_memory_limit();
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    CHECK(mem > 0 && mem <= (size_t)pages * (size_t)page);
}

/* Lines come back whole across block boundaries, with right line numbers,
 * CRLF stripped, a long line growing the buffer and no final newline. */
static void test_lines(void)
{
    char path[] = "/tmp/sdtk-lines-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    for (int i = 1; i <= 2000; i++) fprintf(f, "line %d%s\n", i, i % 3 ? "" : "\r");
    for (int i = 0; i < 10000; i++) fputc('x', f);
    fputc('\n', f);
    fputs("last", f);
    fclose(f);
    sd_lines l;
    sd_error err;
    CHECK(sd_lines_open(&l, path, 4096, &err) == SD_OK);
    long expect = 1;
    int ok = 1, saw_long = 0, saw_last = 0;
    for (;;) {
        char *b;
        size_t len;
        long first;
        if (sd_lines_next(&l, &b, &len, &first, &err) || len == 0) break;
        ok &= first == expect;
        char *lines[256];
        size_t lens[256], used, pos = 0;
        while (pos < len) {
            size_t k = sd_split_lines(b + pos, len - pos, lines, lens, 256, &used);
            for (size_t i = 0; i < k; i++, expect++) {
                if (expect <= 2000) {
                    char want[32];
                    snprintf(want, sizeof want, "line %ld", expect);
                    ok &= strcmp(lines[i], want) == 0 && lens[i] == strlen(want);
                } else if (expect == 2001) {
                    saw_long = lens[i] == 10000;
                } else {
                    saw_last = strcmp(lines[i], "last") == 0;
                }
            }
            pos += used;
        }
    }
    CHECK(ok);
    CHECK(saw_long);
    CHECK(saw_last);
    CHECK(expect == 2003);
    sd_lines_close(&l);
    unlink(path);

    /* a UTF-8 byte order mark before line 1 is not part of it; one later is data */
    char path2[] = "/tmp/sdtk-lines-XXXXXX";
    fd = mkstemp(path2);
    f = fdopen(fd, "w");
    if (!CHECK(f)) return;
    fputs("\xef\xbb\xbf{\"a\":1}\n\xef\xbb\xbfx\n", f);
    fclose(f);
    CHECK(sd_lines_open(&l, path2, 4096, &err) == SD_OK);
    char *b;
    size_t len;
    long first;
    CHECK(sd_lines_next(&l, &b, &len, &first, &err) == SD_OK && first == 1);
    CHECK(len == 13 && memcmp(b, "{\"a\":1}\n\xef\xbb\xbfx\n", 13) == 0);
    sd_lines_close(&l);
    unlink(path2);
}

static void test_utf8(void)
{
    CHECK(sd_utf8_check("plain ascii text here", 21) == 21);
    CHECK(sd_utf8_check("\xe6\x97\xa5\xe6\x9c\xac", 6) == 6);
    CHECK(sd_utf8_check("ab\xff", 3) == 2);
    CHECK(sd_utf8_check("\xe6\x97", 2) == 0);        /* cut short */
    CHECK(sd_utf8_check("\xf4\x90\x80\x80", 4) == 0); /* past U+10FFFF */
    CHECK(sd_utf8_check("\xe0\x80\xaf", 3) == 0);     /* overlong */
}

static void test_sets(void)
{
    sd_keyset ks;
    sd_keyset_init(&ks);
    int ok = 1;
    char k[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof k, "key%d", i);
        ok &= sd_keyset_insert(&ks, sd_key128_of(k, strlen(k))) == 1;
    }
    for (int i = 0; i < 5000; i += 7) {
        snprintf(k, sizeof k, "key%d", i);
        ok &= sd_keyset_insert(&ks, sd_key128_of(k, strlen(k))) == 0;
    }
    CHECK(ok);
    CHECK(ks.n == 5000);
    sd_keyset_free(&ks);
    /* two parts hash as their concatenation, across XXH3's length classes */
    static const size_t cuts[][2] = {{0, 0}, {0, 5}, {5, 0}, {3, 13}, {17, 120}, {100, 141}, {200, 1000}, {1500, 3000}};
    char *cat = malloc(4500);
    if (CHECK(cat != NULL)) {
        for (int i = 0; i < 4500; i++) cat[i] = (char)(i * 37 + (i >> 5));
        for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
            sd_key128 one = sd_key128_of(cat, cuts[c][0] + cuts[c][1]);
            sd_key128 two = sd_key128_of2(cat, cuts[c][0], cat + cuts[c][0], cuts[c][1]);
            CHECK(one.lo == two.lo && one.hi == two.hi);
        }
        free(cat);
    }

    sd_strmap m;
    sd_strmap_init(&m);
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof k, "t%d", i);
        sd_strmap_put(&m, k, strlen(k))->nval = i;
    }
    CHECK(sd_strmap_get(&m, "t299", 4) && sd_strmap_get(&m, "t299", 4)->nval == 299);
    CHECK(sd_strmap_get(&m, "t300", 4) == NULL);
    sd_strmap_free(&m);

    /* the 8-bytes-at-a-time normaliser agrees with the plain rule on every byte value */
    uint64_t st = 99;
    int nbad = 0;
    for (int t = 0; t < 20000; t++) {
        char in[40], out[41];
        size_t len = (size_t)(t % 40);
        for (size_t i = 0; i < len; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            unsigned c = (unsigned)(st >> 56);
            in[i] = t % 3 ? (char)c : "Aa_Zz@[`{ \x80"[c % 12];
        }
        sd_tag_normalize(in, len, out, sizeof out);
        for (size_t i = 0; i < len; i++) {
            char c = in[i];
            char want = c == '_' ? ' ' : (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
            nbad += out[i] != want;
        }
    }
    CHECK(nbad == 0);
    char norm[16];
    CHECK(sd_tag_normalize("Long_Hair", 9, norm, sizeof norm) == 9 && strcmp(norm, "long hair") == 0);
    CHECK(sd_tag_normalize("0123456789abcdef", 16, norm, sizeof norm) == sizeof norm);
}

static void test_braces(void)
{
    char **v;
    int n;
    CHECK(sd_expand_braces("d/{0008..0011}.tar", &v, &n) == 0 && n == 4);
    if (n == 4) {
        CHECK_STR(v[0], "d/0008.tar");
        CHECK_STR(v[3], "d/0011.tar");
    }
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    CHECK(sd_expand_braces("{a,b}-{1..2}", &v, &n) == 0 && n == 4);
    if (n == 4) CHECK_STR(v[3], "b-2");
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    CHECK(sd_expand_braces("x{5..1}", &v, &n) != 0);
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

static void test_pattern(void)
{
    char text[] = "{\"id\": 1234567, \"file_ext\": \"png\", \"file\": {\"md5\": \"abc\"}}";
    sd_arena a;
    sd_arena_init(&a, 4096);
    sd_json *o;
    sd_error err;
    CHECK(sd_json_parse(&a, text, strlen(text), &o, &err) == SD_OK);
    sd_buf b;
    sd_buf_init(&b);
    const char *missing = NULL;
    CHECK(sd_pattern_format("{id%1000:04d}/{id}.{file_ext}", o, &b, &missing) == 0);
    CHECK_STR(sd_buf_cstr(&b), "0567/1234567.png");
    sd_buf_clear(&b);
    CHECK(sd_pattern_format("{md5}.{ext}", o, &b, &missing) == 0);
    CHECK_STR(sd_buf_cstr(&b), "abc.png");
    sd_buf_clear(&b);
    CHECK(sd_pattern_format("{nope}.jpg", o, &b, &missing) == -1 && strncmp(missing, "nope", 4) == 0);
    sd_buf_free(&b);
    sd_arena_free(&a);
}

/* The exact fast path agrees with the printf reference on random values of
 * every magnitude it handles (and ones it hands on), and reads back exactly. */
static void test_dtoa(void)
{
    uint64_t state = 12345;
    int bad = 0, n = 0;
    char a[64], b[64];
    for (int i = 0; i < 300000; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        double v;
        switch (i % 4) {
        case 0: v = (double)(state >> 11) / 9007199254740992.0 * 4000.0; break;           /* crop-like */
        case 1: v = (double)(state >> 40) / 3.0 + 0.1 * (double)(i % 7); break;           /* thirds, tenths */
        case 2: v = ldexp((double)(state >> 11), -(int)(state % 70)); break;                /* any exponent */
        default: v = (double)(int)(state >> 45) / 1024.0 - 500.0; break;                   /* short binary */
        }
        if (v == floor(v)) continue;
        sd_dtoa_shortest(v, a, sizeof a);
        sd_dtoa_shortest_printf(v, b, sizeof b);
        n++;
        if (strtod(a, NULL) != v || strtod(b, NULL) != strtod(a, NULL) || strlen(a) > strlen(b) + 0 ||
            (strchr(b, 'e') == NULL && strcmp(a, b) != 0)) {
            if (bad++ < 5) fprintf(stderr, "dtoa %.17g: fast '%s' reference '%s'\n", v, a, b);
        }
    }
    CHECK(bad == 0);
    CHECK(n > 200000);
    sd_dtoa_shortest(1253.8000000000002, a, sizeof a);
    CHECK_STR(a, "1253.8000000000002");
    sd_dtoa_shortest(0.1, a, sizeof a);
    CHECK_STR(a, "0.1");
    sd_dtoa_shortest(-2.5, a, sizeof a);
    CHECK_STR(a, "-2.5");
    /* floats print with the digits they were given (a UNet's norm_eps) */
    static const struct {
        float f;
        const char *want;
    } fl[] = {{1e-5f, "1e-05"}, {1e-6f, "1e-06"}, {0.1f, "0.1"}, {-2.5f, "-2.5"}, {3.14159274f, "3.1415927"},
              {0.18215f, "0.18215"}, {1e10f, "10000000000.0"}, {1e-45f, "1e-45"}, {3.4028235e38f, "3.4028235e+38"}};
    for (size_t i = 0; i < sizeof fl / sizeof *fl; i++) {
        double d = sd_f32_shortest(fl[i].f);
        CHECK((float)d == fl[i].f);
        if (d == floor(d) && fabs(d) < 9e15) snprintf(a, sizeof a, "%.1f", d);
        else sd_dtoa_shortest(d, a, sizeof a);
        CHECK_STR(a, fl[i].want);
    }
}

/* The words sd_cli_expand makes of argv, joined by spaces (argv0 left
 * out), into out; its return code. */
static int expand_words(const sd_cli *cli, int argc, char **argv, char *out, size_t cap)
{
    sd_cli_args a;
    int rc = sd_cli_expand(cli, argc, argv, &a);
    out[0] = 0;
    if (rc != -1) return rc;
    for (int i = 1; i < a.argc; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i > 1 ? " " : "", a.argv[i]);
    sd_cli_args_free(&a);
    return rc;
}

/* A false flag from --set drops the flag's words in option position only:
 * a value that happens to read --flip (-o --flip) or a word after "--"
 * stays. */
static void test_cli_false_flag(void)
{
    const char *output = NULL, *cfg = NULL;
    int flip = 0;
    sd_strlist sets = {0};
    const sd_opt opts[] = {{"output", 'o', SD_OPT_STR, &output, "F", "out"},
                           {"flip", 'f', SD_OPT_FLAG, &flip, NULL, "flip"},
                           {"config", 0, SD_OPT_STR, &cfg, "F", "config"},
                           {"set", 0, SD_OPT_LIST, &sets, "K=V", "set"},
                           {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"t", "", "", opts, NULL, NULL};
    char w[512];
    char *a1[] = {"t", "-o", "--flip", "--set", "flip=false"};
    CHECK(expand_words(&cli, 5, a1, w, sizeof w) == -1);
    CHECK_STR(w, "-o --flip");
    char *a2[] = {"t", "--flip", "--output", "--flip", "-f", "x", "--set", "flip=false"};
    CHECK(expand_words(&cli, 8, a2, w, sizeof w) == -1);
    CHECK_STR(w, "--output --flip x");
    char *a3[] = {"t", "--output=--flip", "-f", "--set", "flip=0", "--", "--flip"};
    CHECK(expand_words(&cli, 7, a3, w, sizeof w) == -1);
    CHECK_STR(w, "--output=--flip -- --flip");
    char *a4[] = {"t", "-o", "-f", "-f", "--set", "flip=true", "--set", "flip=false"};
    CHECK(expand_words(&cli, 8, a4, w, sizeof w) == -1);
    CHECK_STR(w, "-o -f");
}

/* The final progress line of a run that took `secs` for `done` items. */
static void progress_line(double secs, uint64_t done, char *out, size_t cap)
{
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *f = tmpfile();
    out[0] = 0;
    if (saved < 0 || !f) return;
    dup2(fileno(f), STDERR_FILENO);
    sd_progress p;
    sd_progress_init(&p, "t", "images", 0, 1);
    p.start -= secs;
    p.done = done;
    sd_progress_finish(&p);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

/* A slow stage's rate keeps its digits (0.05/s, not 0/s). */
static void test_progress_rate(void)
{
    char line[256];
    progress_line(100, 5, line, sizeof line);
    CHECK(strstr(line, " 0.05 images/s") != NULL);
    progress_line(10, 50, line, sizeof line);
    CHECK(strstr(line, " 5.0 images/s") != NULL);
    progress_line(10, 500, line, sizeof line);
    CHECK(strstr(line, " 50 images/s") != NULL);
}

/* sd_splitmix64 is the published splitmix64 stream (its first outputs from
 * seed 0), which the UNet's random init, the trainer's RNG seeding and
 * --sample's noise each used to carry a copy of. */
static void test_splitmix64(void)
{
    uint64_t s = 0;
    CHECK(sd_splitmix64(&s) == 0xe220a8397b1dcdafull);
    CHECK(sd_splitmix64(&s) == 0x6e789e6aa1b965f4ull);
    CHECK(sd_splitmix64(&s) == 0x06c45d188009454full);
    CHECK(s == 3 * 0x9e3779b97f4a7c15ull);
}

int main(void)
{
    test_dtoa();
    test_pool();
    test_lines();
    test_utf8();
    test_sets();
    test_braces();
    test_pattern();
    test_cli_false_flag();
    test_progress_rate();
    test_splitmix64();
    return check_done("test_core");
}
