/* JSON parser and writer: round trips, escapes, UTF-8 checks and rejection
 * of malformed input. */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "check.h"
#include "json.h"

/* Parse a copy of text; returns the status and the root in *out. */
static sd_status parse(sd_arena *a, const char *text, sd_json **out)
{
    size_t n = strlen(text);
    char *copy = sd_arena_strndup(a, text, n);
    sd_error err;
    return sd_json_parse(a, copy, n, out, &err);
}

/* Parse then write compactly and compare with the expected text. */
static void roundtrip(sd_arena *a, const char *in, const char *want)
{
    sd_json *v;
    if (!CHECK(parse(a, in, &v) == SD_OK)) return;
    sd_buf b;
    sd_buf_init(&b);
    sd_json_write(&b, v);
    CHECK_STR(sd_buf_cstr(&b), want);
    sd_buf_free(&b);
}

int main(void)
{
    sd_arena a;
    sd_arena_init(&a, 4096);
    sd_json *v;

    roundtrip(&a, " {\"a\" : [1, 2.5, -3e2, true, false, null], \"b\":{}} ", "{\"a\":[1,2.5,-3e2,true,false,null],\"b\":{}}");
    roundtrip(&a, "\"tab\\there \\\"q\\\" \\u00e9 \\ud83d\\ude00 \\/\"", "\"tab\\there \\\"q\\\" \xc3\xa9 \xf0\x9f\x98\x80 /\"");
    roundtrip(&a, "\"\\u0001\"", "\"\\u0001\"");
    roundtrip(&a, "12345678901234567890", "12345678901234567890");

    CHECK(parse(&a, "{\"id\": 12, \"s\": \"x\"}", &v) == SD_OK);
    double d = 0;
    CHECK(sd_json_num(sd_json_get(v, "id"), &d) == 0 && d == 12);
    CHECK_STR(sd_json_str(sd_json_get(v, "s")), "x");
    CHECK(sd_json_get(v, "missing") == NULL);
    CHECK(parse(&a, "\"42\"", &v) == SD_OK && sd_json_num(v, &d) == 0 && d == 42);
    /* quoted "nan"/"inf" and an overflowing literal are not numbers: NaN
     * would pass every range check after it */
    const char *nonfinite[] = {"\"nan\"", "\"NaN\"", "\"inf\"", "\"-infinity\"", "1e999", "-1e999"};
    for (size_t i = 0; i < sizeof nonfinite / sizeof *nonfinite; i++)
        CHECK(parse(&a, nonfinite[i], &v) == SD_OK && sd_json_num(v, &d) == -1);
    /* whole numbers in a range, checked before any cast to an integer */
    CHECK(parse(&a, "[7, 7.5, -1, 1e10, 1e300, \"12\", \"nan\", 0, 100, true]", &v) == SD_OK);
    const int whole_ok[] = {1, 0, 0, 0, 0, 1, 0, 1, 1, 0};
    int el = 0;
    for (const sd_json *e = v->child; e; e = e->next, el++) {
        d = -5;
        int ok = sd_json_whole(e, 0, 100, &d) == 0;
        if (!CHECK(ok == whole_ok[el])) fprintf(stderr, "  sd_json_whole: element %d\n", el);
        if (!ok) CHECK(d == -5); /* untouched on refusal */
    }

    const char *bad[] = {"", "{", "[1,]", "{\"a\" 1}", "{\"a\":1,}", "01", "1.", "-", "tru", "\"abc", "\"\\x\"",
                         "\"\\ud800\"", "\"\\udc00x\"", "\"a\tb\"", "[1] 2", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
                         "{\"a\":nul}", "1e", "[\"\\u12\"]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (!CHECK(parse(&a, bad[i], &v) != SD_OK)) fprintf(stderr, "  accepted: %s\n", bad[i]);
    }
    /* deep nesting is refused, not a stack overflow */
    char deep[4001];
    memset(deep, '[', 4000);
    deep[4000] = 0;
    CHECK(parse(&a, deep, &v) == SD_EPARSE);

    /* Python's json.dumps words: refused by the strict parser, read by
     * sd_json_parse_py as non-finite numbers, written back as null */
    const char *py = "{\"a\": NaN, \"b\": [Infinity, -Infinity, 1.5], \"c\": \"NaN\"}";
    CHECK(parse(&a, py, &v) == SD_EPARSE);
    {
        size_t n = strlen(py);
        char *copy = sd_arena_strndup(&a, py, n);
        sd_error err;
        int nf = -1;
        if (CHECK(sd_json_parse_py(&a, copy, n, &v, &nf, &err) == SD_OK)) {
            CHECK(nf == 3);
            const sd_json *na = sd_json_get(v, "a"), *inf = sd_json_get(v, "b")->child;
            CHECK(na->type == SD_JSON_NUMBER && na->num != na->num && sd_json_num(na, &d) == -1);
            CHECK(inf->type == SD_JSON_NUMBER && inf->num > 1e308 && inf->next->num < -1e308);
            sd_buf w;
            sd_buf_init(&w);
            sd_json_write(&w, v);
            CHECK_STR(sd_buf_cstr(&w), "{\"a\":null,\"b\":[null,null,1.5],\"c\":\"NaN\"}");
            sd_buf_free(&w);
        }
        const char *pybad[] = {"nan", "-NaN", "Infinit", "+Infinity", "NaNa", "[Inf]", "-infinity", "NaN1"};
        for (size_t i = 0; i < sizeof pybad / sizeof *pybad; i++) {
            n = strlen(pybad[i]);
            copy = sd_arena_strndup(&a, pybad[i], n);
            if (!CHECK(sd_json_parse_py(&a, copy, n, &v, &nf, &err) != SD_OK))
                fprintf(stderr, "  accepted: %s\n", pybad[i]);
        }
    }

    /* writer escapes */
    sd_buf b;
    sd_buf_init(&b);
    sd_buf_json_str(&b, "a\"b\\c\nd\x01", 8);
    CHECK_STR(sd_buf_cstr(&b), "\"a\\\"b\\\\c\\nd\\u0001\"");
    sd_buf_clear(&b);
    sd_buf_json_num(&b, 0.1);
    sd_buf_putc(&b, ' ');
    sd_buf_json_num(&b, -7);
    sd_buf_putc(&b, ' ');
    sd_buf_json_int(&b, INT64_MIN);
    CHECK_STR(sd_buf_cstr(&b), "0.1 -7 -9223372036854775808");
    sd_buf_free(&b);
    sd_arena_free(&a);
    return check_done("test_json");
}
