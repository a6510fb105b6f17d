/* .npy header parser and writer, .npz reader and writer, and the fp16/bf16
 * conversions: strict validation cases and write->read round trips. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "half.h"
#include "npy.h"
#include "npz.h"

/* A v1.0 .npy made of a literal header dict and n data bytes (zeros). */
static size_t make_npy(unsigned char *out, const char *dict, size_t ndata)
{
    size_t h = strlen(dict);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(h + 1);
    out[9] = (unsigned char)((h + 1) >> 8);
    memcpy(out + 10, dict, h);
    out[10 + h] = '\n';
    memset(out + 11 + h, 0, ndata);
    return 11 + h + ndata;
}

/* Parse a literal header with ndata bytes of data; returns the status. */
static sd_status parse_dict(const char *dict, size_t ndata, sd_npy_info *info)
{
    unsigned char *buf = malloc(strlen(dict) + 16 + ndata);
    size_t n = make_npy(buf, dict, ndata);
    const void *p;
    sd_error err;
    sd_err_clear(&err);
    sd_status st = sd_npy_parse(buf, n, info, &p, &err);
    free(buf);
    return st;
}

/* Good headers in the spellings numpy and hand-written files use. */
static void test_header_ok(void)
{
    sd_npy_info in;
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8, 8), }", 4 * 64 * 4, &in) == SD_OK);
    CHECK(in.dtype == SD_NPY_F32 && in.ndim == 3 && in.shape[0] == 4 && in.count == 256 && in.nbytes == 1024);
    CHECK(parse_dict("{\"shape\":(2,),\"descr\":\"<i8\",\"fortran_order\":False}", 16, &in) == SD_OK);
    CHECK(in.dtype == SD_NPY_I64 && in.ndim == 1 && in.shape[0] == 2);
    CHECK(parse_dict("{'descr': '<f8', 'fortran_order': False, 'shape': ()}", 8, &in) == SD_OK);
    CHECK(in.ndim == 0 && in.count == 1);
    CHECK(parse_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (0, 3), }", 0, &in) == SD_OK);
    CHECK(in.count == 0);
    CHECK(parse_dict("{'descr': '<f2', 'fortran_order': False, 'shape': (3, 2,), }", 12, &in) == SD_OK);
}

/* Every field is validated; each bad header gets an error, not a crash. */
static void test_header_bad(void)
{
    sd_npy_info in;
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, &in) == SD_EUNSUPPORTED);
    CHECK(parse_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, &in) == SD_EUNSUPPORTED);
    CHECK(parse_dict("{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }", 4, &in) == SD_EUNSUPPORTED);
    CHECK(parse_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, &in) == SD_EUNSUPPORTED);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", 8, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (02,), }", 8, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False}", 4, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", 4, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x", 4, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 3, &in) == SD_ETRUNC);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 5, &in) == SD_EFORMAT);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1073741824, 1073741824, 1073741824), }", 0,
                     &in) == SD_ERANGE);
    CHECK(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, &in) ==
          SD_EUNSUPPORTED);
    unsigned char buf[256];
    size_t n = make_npy(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    const void *p;
    sd_error err;
    CHECK(sd_npy_parse(buf, 9, &in, &p, &err) == SD_ETRUNC);
    CHECK(sd_npy_parse(buf, 40, &in, &p, &err) == SD_ETRUNC);
    buf[6] = 4;
    CHECK(sd_npy_parse(buf, n, &in, &p, &err) == SD_EUNSUPPORTED);
    buf[6] = 1;
    buf[0] = 'X';
    CHECK(sd_npy_parse(buf, n, &in, &p, &err) == SD_EFORMAT);
}

/* What the writer produces parses back to the same array; 64-byte aligned. */
static void test_write_roundtrip(void)
{
    float v[6] = {1, -2, 3.5f, 0, 1e-3f, 65504};
    uint64_t shape[2] = {2, 3};
    sd_buf b;
    sd_buf_init(&b);
    sd_error err;
    CHECK(sd_npy_write(&b, SD_NPY_F32, 2, shape, v, &err) == SD_OK);
    sd_npy_info in;
    const void *p;
    CHECK(sd_npy_parse(b.data, b.len, &in, &p, &err) == SD_OK);
    CHECK(in.data_offset % 64 == 0 && in.ndim == 2 && in.shape[1] == 3 && memcmp(p, v, sizeof v) == 0);
    sd_buf_clear(&b);
    uint64_t one = 4;
    CHECK(sd_npy_write(&b, SD_NPY_F32, 1, &one, v, &err) == SD_OK);
    CHECK(memmem(b.data, b.len, "'shape': (4,)", 13) != NULL);
    CHECK(sd_npy_write(&b, SD_NPY_BF16, 1, &one, v, &err) == SD_EUNSUPPORTED);
    sd_buf_free(&b);
}

/* npz written by the writer reads back; a truncated or corrupted one fails. */
static void test_npz(void)
{
    sd_npz_writer w;
    sd_error err;
    float lat[2 * 3 * 4];
    for (int i = 0; i < 24; i++) lat[i] = (float)i * 0.25f;
    int64_t osz[2] = {640, 480};
    uint64_t s3[3] = {2, 3, 4}, s1 = 2;
    CHECK(sd_npz_writer_init(&w, &err) == SD_OK);
    CHECK(sd_npz_writer_add(&w, "latents", SD_NPY_F32, 3, s3, lat, &err) == SD_OK);
    CHECK(sd_npz_writer_add(&w, "original_size", SD_NPY_I64, 1, &s1, osz, &err) == SD_OK);
    CHECK(sd_npz_writer_finish(&w, &err) == SD_OK);
    sd_npz z;
    CHECK(sd_npz_read_mem(&z, w.out.data, w.out.len, &err) == SD_OK);
    CHECK(z.n == 2);
    const sd_npz_member *m = sd_npz_find(&z, "latents");
    CHECK(m && m->info.dtype == SD_NPY_F32 && m->info.ndim == 3 && memcmp(m->data, lat, sizeof lat) == 0);
    m = sd_npz_find(&z, "original_size");
    CHECK(m && m->info.dtype == SD_NPY_I64 && memcmp(m->data, osz, sizeof osz) == 0);
    CHECK(sd_npz_find(&z, "nope") == NULL);
    sd_npz_free(&z);
    CHECK(sd_npz_read_mem(&z, w.out.data, w.out.len / 2, &err) != SD_OK);
    CHECK(z.n == 0 && z.m == NULL);
    unsigned char *bad = malloc(w.out.len);
    memcpy(bad, w.out.data, w.out.len);
    bad[200] ^= 0x40; /* inside the latents payload: the CRC must catch it */
    CHECK(sd_npz_read_mem(&z, bad, w.out.len, &err) != SD_OK);
    free(bad);
    CHECK(sd_npz_read_mem(&z, "PK\x03\x04 not really a zip at all.....", 34, &err) != SD_OK);
    sd_npz_writer_free(&w);
}

/* fp16 rounding matches IEEE round-to-nearest-even at the edges numpy tests. */
static void test_half(void)
{
    CHECK(sd_f32_to_f16(1.0f) == 0x3c00);
    CHECK(sd_f32_to_f16(-2.0f) == 0xc000);
    CHECK(sd_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(sd_f32_to_f16(65520.0f) == 0x7c00);  /* halfway to the next: rounds to even = inf */
    CHECK(sd_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(sd_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie, even stays */
    CHECK(sd_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02); /* tie, odd rounds up */
    CHECK(sd_f32_to_f16(ldexpf(1, -24)) == 0x0001);
    CHECK(sd_f32_to_f16(ldexpf(1, -25)) == 0x0000);     /* tie to even (zero) */
    CHECK(sd_f32_to_f16(ldexpf(1.5f, -25)) == 0x0001);
    CHECK(sd_f32_to_f16(ldexpf(1, -14)) == 0x0400);
    CHECK(sd_f32_to_f16(INFINITY) == 0x7c00);
    CHECK((sd_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (sd_f32_to_f16(NAN) & 0x3ff));
    for (uint32_t h = 0; h < 0x7c00; h++) CHECK_STR(sd_f32_to_f16(sd_f16_to_f32((uint16_t)h)) == h ? "ok" : "bad", "ok");
    CHECK(sd_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(sd_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(sd_f32_to_bf16(1.00390625f) == 0x3f80);  /* tie to even */
    CHECK(sd_f32_to_bf16(1.01171875f) == 0x3f82);  /* tie, odd rounds up */
    float src[3] = {0.5f, -1.25f, 3.0f}, back[3];
    uint16_t h[3];
    sd_error err;
    CHECK(sd_convert(SD_NPY_F16, h, SD_NPY_F32, src, 3, &err) == SD_OK);
    CHECK(sd_convert(SD_NPY_F32, back, SD_NPY_F16, h, 3, &err) == SD_OK);
    CHECK(memcmp(src, back, sizeof src) == 0);
    CHECK(sd_convert(SD_NPY_I64, h, SD_NPY_F32, src, 3, &err) == SD_EUNSUPPORTED);
}

int main(void)
{
    test_header_ok();
    test_header_bad();
    test_write_roundtrip();
    test_npz();
    test_half();
    return check_done("test_npy");
}
