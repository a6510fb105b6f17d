#include "npy.h"

#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "sdtk reads and writes little-endian .npy data in place: big-endian hosts are not supported"
#endif

enum {
    MAX_HEADER = 1 << 16,    /* numpy itself refuses headers over 10000 bytes by default */
    MAX_DIM_VALUE = 1 << 30, /* no tensor sdtk handles has a longer axis */
    ALIGN = 64
};
static const uint64_t MAX_NBYTES = (uint64_t)1 << 40;

static const struct {
    const char *descr;
    size_t size;
    const char *name;
} dtypes[SD_NPY_DT_COUNT] = {
    [SD_NPY_F16] = {"<f2", 2, "fp16"}, [SD_NPY_BF16] = {NULL, 2, "bf16"}, [SD_NPY_F32] = {"<f4", 4, "fp32"},
    [SD_NPY_F64] = {"<f8", 8, "fp64"}, [SD_NPY_I8] = {"|i1", 1, "int8"},  [SD_NPY_U8] = {"|u1", 1, "uint8"},
    [SD_NPY_I32] = {"<i4", 4, "int32"}, [SD_NPY_I64] = {"<i8", 8, "int64"}, [SD_NPY_BOOL] = {"|b1", 1, "bool"},
};

/* Bytes per element, for sizing payloads. */
size_t sd_npy_dtype_size(sd_npy_dtype t)
{
    return (unsigned)t < SD_NPY_DT_COUNT ? dtypes[t].size : 0;
}

/* A short name for messages, reports and --dtype values. */
const char *sd_npy_dtype_name(sd_npy_dtype t)
{
    return (unsigned)t < SD_NPY_DT_COUNT ? dtypes[t].name : "?";
}

/* Parse a short name as sd_npy_dtype_name prints it (also float16/float32/...);
 * 0 on success. */
int sd_npy_dtype_parse(const char *name, sd_npy_dtype *out)
{
    static const struct {
        const char *alias;
        sd_npy_dtype t;
    } aliases[] = {{"float16", SD_NPY_F16}, {"half", SD_NPY_F16}, {"bfloat16", SD_NPY_BF16},
                   {"float32", SD_NPY_F32}, {"float", SD_NPY_F32}, {"float64", SD_NPY_F64}};
    for (int t = 0; t < SD_NPY_DT_COUNT; t++)
        if (strcmp(name, dtypes[t].name) == 0) {
            *out = (sd_npy_dtype)t;
            return 0;
        }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(name, aliases[i].alias) == 0) {
            *out = aliases[i].t;
            return 0;
        }
    return -1;
}

/* Cursor over the header text (the Python dict literal). */
typedef struct {
    const char *p, *end;
} cursor;

/* Skip the whitespace Python allows between tokens. */
static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/* Consume one expected character (after whitespace); 0 when it was there. */
static int expect(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 0;
    }
    return -1;
}

/* A quoted string without escapes into out (NUL-terminated); 0 on success. */
static int read_string(cursor *c, char *out, size_t cap)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return -1;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || (unsigned char)*c->p < 0x20 || n + 1 >= cap) return -1;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end) return -1;
    c->p++;
    out[n] = 0;
    return 0;
}

/* A bare word (True, False) into out; 0 on success. */
static int read_word(cursor *c, char *out, size_t cap)
{
    skip_ws(c);
    size_t n = 0;
    while (c->p < c->end && ((*c->p >= 'A' && *c->p <= 'Z') || (*c->p >= 'a' && *c->p <= 'z'))) {
        if (n + 1 >= cap) return -1;
        out[n++] = *c->p++;
    }
    out[n] = 0;
    return n ? 0 : -1;
}

/* A non-negative decimal integer as Python writes it (no sign, no leading
 * zeros, no underscores), at most MAX_DIM_VALUE; 0 on success. */
static int read_dim(cursor *c, uint64_t *out)
{
    skip_ws(c);
    const char *s = c->p;
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        v = v * 10 + (uint64_t)(*c->p - '0');
        if (v > MAX_DIM_VALUE) return -1;
        c->p++;
    }
    if (c->p == s || (c->p - s > 1 && *s == '0')) return -1;
    *out = v;
    return 0;
}

/* The shape tuple: "()", "(n,)", "(a, b)", "(a, b,)"; a one-element tuple
 * needs its comma, as in Python. */
static sd_status read_shape(cursor *c, sd_npy_info *info, sd_error *err)
{
    if (expect(c, '(')) return sd_err_set(err, SD_EFORMAT, "npy header: 'shape' is not a tuple");
    info->ndim = 0;
    skip_ws(c);
    if (c->p < c->end && *c->p == ')') {
        c->p++;
        return SD_OK;
    }
    int commas = 0;
    for (;;) {
        if (info->ndim == SD_NPY_MAXDIM)
            return sd_err_set(err, SD_EUNSUPPORTED, "npy header: more than %d dimensions", SD_NPY_MAXDIM);
        if (read_dim(c, &info->shape[info->ndim]))
            return sd_err_set(err, SD_EFORMAT, "npy header: bad dimension %d in 'shape' (not an integer in 0..%d)",
                              info->ndim, MAX_DIM_VALUE);
        info->ndim++;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            commas++;
            skip_ws(c);
            if (c->p < c->end && *c->p == ')') break;
            continue;
        }
        if (c->p < c->end && *c->p == ')') break;
        return sd_err_set(err, SD_EFORMAT, "npy header: 'shape' tuple is malformed");
    }
    c->p++;
    if (info->ndim == 1 && commas == 0)
        return sd_err_set(err, SD_EFORMAT, "npy header: 'shape' (n) is not a tuple (needs a comma)");
    return SD_OK;
}

/* Map a numpy descr string to a dtype, with a clear reason for the ones we
 * refuse. */
static sd_status parse_descr(const char *d, sd_npy_dtype *out, sd_error *err)
{
    for (int t = 0; t < SD_NPY_DT_COUNT; t++)
        if (dtypes[t].descr && strcmp(d, dtypes[t].descr) == 0) {
            *out = (sd_npy_dtype)t;
            return SD_OK;
        }
    if (strcmp(d, "<u1") == 0 || strcmp(d, "=u1") == 0) { /* u1 has no byte order; accept any spelling */
        *out = SD_NPY_U8;
        return SD_OK;
    }
    if (d[0] == '>' && d[1] && strchr("fiub", d[1]))
        return sd_err_set(err, SD_EUNSUPPORTED, "npy dtype '%s' is big-endian (only little-endian is supported)", d);
    if (d[0] && d[1] == 'V')
        return sd_err_set(err, SD_EUNSUPPORTED,
                          "npy dtype '%s' is raw bytes (bfloat16 has no numpy dtype; store it as float32)", d);
    return sd_err_set(err, SD_EUNSUPPORTED, "npy dtype '%s' is not supported (f2, f4, f8, i1, u1, i4, i8, b1)", d);
}

/* Multiply out the shape into element and byte counts, refusing overflow
 * and arrays too large to be a cache tensor. */
static sd_status size_array(sd_npy_info *info, sd_error *err)
{
    uint64_t n = 1;
    for (int i = 0; i < info->ndim; i++) {
        if (info->shape[i] && n > MAX_NBYTES / info->shape[i])
            return sd_err_set(err, SD_ERANGE, "npy array too large");
        n *= info->shape[i];
    }
    uint64_t bytes = n * dtypes[info->dtype].size;
    if (bytes > MAX_NBYTES) return sd_err_set(err, SD_ERANGE, "npy array too large");
    info->count = n;
    info->nbytes = bytes;
    return SD_OK;
}

/* Parse the dict literal {'descr': ..., 'fortran_order': ..., 'shape': ...}:
 * exactly those three keys, each once, in any order. */
static sd_status parse_dict(cursor *c, sd_npy_info *info, sd_error *err)
{
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (expect(c, '{')) return sd_err_set(err, SD_EFORMAT, "npy header is not a dict");
    for (;;) {
        skip_ws(c);
        if (c->p < c->end && *c->p == '}') break;
        char key[32], val[32];
        if (read_string(c, key, sizeof key) || expect(c, ':'))
            return sd_err_set(err, SD_EFORMAT, "npy header: expected 'key': value");
        if (strcmp(key, "descr") == 0) {
            if (have_descr++) return sd_err_set(err, SD_EFORMAT, "npy header: 'descr' given twice");
            if (read_string(c, val, sizeof val))
                return sd_err_set(err, SD_EUNSUPPORTED, "npy header: 'descr' is not a simple dtype string "
                                                        "(structured dtypes are not supported)");
            sd_status st = parse_descr(val, &info->dtype, err);
            if (st) return st;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_order++) return sd_err_set(err, SD_EFORMAT, "npy header: 'fortran_order' given twice");
            if (read_word(c, val, sizeof val) || (strcmp(val, "True") && strcmp(val, "False")))
                return sd_err_set(err, SD_EFORMAT, "npy header: 'fortran_order' is not True or False");
            if (strcmp(val, "True") == 0)
                return sd_err_set(err, SD_EUNSUPPORTED,
                                  "npy array is in Fortran order (fortran_order: True); only C order is supported");
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape++) return sd_err_set(err, SD_EFORMAT, "npy header: 'shape' given twice");
            sd_status st = read_shape(c, info, err);
            if (st) return st;
        } else {
            return sd_err_set(err, SD_EFORMAT, "npy header: unexpected key '%s'", key);
        }
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        skip_ws(c);
        if (c->p < c->end && *c->p == '}') break;
        return sd_err_set(err, SD_EFORMAT, "npy header: expected ',' or '}'");
    }
    c->p++;
    skip_ws(c);
    if (c->p != c->end) return sd_err_set(err, SD_EFORMAT, "npy header: text after the dict");
    if (!have_descr || !have_order || !have_shape)
        return sd_err_set(err, SD_EFORMAT, "npy header: missing '%s'",
                          !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return SD_OK;
}

/* Read the magic, version and header dict from the start of a .npy file;
 * len may cover only the header. Fills info (data_offset, shape, sizes). */
sd_status sd_npy_parse_header(const void *data, size_t len, sd_npy_info *info, sd_error *err)
{
    const unsigned char *b = data;
    memset(info, 0, sizeof *info);
    if (len < 10) return sd_err_set(err, SD_ETRUNC, "npy file too short (%zu bytes)", len);
    if (memcmp(b, "\x93NUMPY", 6) != 0) return sd_err_set(err, SD_EFORMAT, "not a .npy file (bad magic)");
    int major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return sd_err_set(err, SD_EUNSUPPORTED, "npy format version %d.%d not supported (1.0, 2.0, 3.0)", major,
                          minor);
    size_t pre = major == 1 ? 10 : 12;
    if (len < pre) return sd_err_set(err, SD_ETRUNC, "npy header truncated");
    size_t hlen = major == 1 ? (size_t)b[8] | (size_t)b[9] << 8
                             : (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (hlen > MAX_HEADER) return sd_err_set(err, SD_ERANGE, "npy header too long (%zu bytes)", hlen);
    if (len - pre < hlen) return sd_err_set(err, SD_ETRUNC, "npy header truncated (%zu of %zu bytes)", len - pre, hlen);
    const char *h = (const char *)b + pre;
    for (size_t i = 0; i < hlen; i++) { /* v3 allows UTF-8, but only for structured field names */
        unsigned char ch = (unsigned char)h[i];
        if (ch >= 0x80 || (ch < 0x20 && ch != '\n' && ch != '\t' && ch != '\r'))
            return sd_err_set(err, SD_EFORMAT, "npy header: byte 0x%02x at offset %zu is not printable ASCII", ch,
                              pre + i);
    }
    cursor c = {h, h + hlen};
    sd_status st = parse_dict(&c, info, err);
    if (st) return st;
    info->version = major;
    info->data_offset = pre + hlen;
    return size_array(info, err);
}

/* Parse a whole .npy file held in memory; *payload points at the array data,
 * which must be exactly the bytes the header promises. */
sd_status sd_npy_parse(const void *data, size_t len, sd_npy_info *info, const void **payload, sd_error *err)
{
    sd_status st = sd_npy_parse_header(data, len, info, err);
    if (st) return st;
    uint64_t have = len - info->data_offset;
    if (have < info->nbytes)
        return sd_err_set(err, SD_ETRUNC, "npy data truncated (%llu of %llu bytes)", (unsigned long long)have,
                          (unsigned long long)info->nbytes);
    if (have > info->nbytes)
        return sd_err_set(err, SD_EFORMAT, "npy file has %llu bytes after the array data",
                          (unsigned long long)(have - info->nbytes));
    *payload = (const unsigned char *)data + info->data_offset;
    return SD_OK;
}

/* Append a .npy file (header as numpy writes it, padded so the data starts
 * on a 64-byte boundary; v1.0, or v2.0 for huge headers) and the data. */
sd_status sd_npy_write(sd_buf *out, sd_npy_dtype t, int ndim, const uint64_t *shape, const void *data, sd_error *err)
{
    if ((unsigned)t >= SD_NPY_DT_COUNT || !dtypes[t].descr)
        return sd_err_set(err, SD_EUNSUPPORTED, "dtype %s cannot be written to .npy", sd_npy_dtype_name(t));
    if (ndim < 0 || ndim > SD_NPY_MAXDIM) return sd_err_set(err, SD_EINVAL, "npy: %d dimensions", ndim);
    sd_npy_info info = {.dtype = t, .ndim = ndim};
    for (int i = 0; i < ndim; i++) info.shape[i] = shape[i];
    sd_status st = size_array(&info, err);
    if (st) return st;
    sd_buf h;
    sd_buf_init(&h);
    sd_buf_printf(&h, "{'descr': '%s', 'fortran_order': False, 'shape': (", dtypes[t].descr);
    for (int i = 0; i < ndim; i++) sd_buf_printf(&h, i ? ", %llu" : "%llu", (unsigned long long)shape[i]);
    sd_buf_puts(&h, ndim == 1 ? ",), }" : "), }");
    size_t pre = h.len + 1 + 10 > 65535 ? 12 : 10;
    size_t total = (pre + h.len + 1 + ALIGN - 1) / ALIGN * ALIGN;
    while (pre + h.len + 1 < total) sd_buf_putc(&h, ' ');
    sd_buf_putc(&h, '\n');
    size_t hlen = h.len;
    unsigned char magic[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', pre == 10 ? 1 : 2, 0};
    magic[8] = (unsigned char)hlen;
    magic[9] = (unsigned char)(hlen >> 8);
    magic[10] = (unsigned char)(hlen >> 16);
    magic[11] = (unsigned char)(hlen >> 24);
    sd_buf_put(out, magic, pre);
    sd_buf_put(out, h.data, hlen);
    if (info.nbytes) sd_buf_put(out, data, (size_t)info.nbytes);
    int oom = h.oom;
    sd_buf_free(&h);
    if (oom || out->oom) return sd_err_set(err, SD_ENOMEM, "out of memory writing .npy");
    return SD_OK;
}
