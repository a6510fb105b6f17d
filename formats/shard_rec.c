/* The shard record codec: building a record value (header, name, aligned
 * tensors, checksums) and parsing one without trusting any of its bytes.
 * Layout: docs/FORMATS.md, "Shard format, version 1" (record versions 1 and 2). */
#include <math.h>
#include <string.h>

#include "hash.h"
#include "shard.h"

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_HDRSIZE = 6,
    OFF_KIND = 8,
    OFF_NTENSORS = 9,
    OFF_FLAGS = 10,
    OFF_NAMELEN = 12,
    OFF_RSV0 = 14,
    OFF_ORIG = 16,
    OFF_BUCKET = 24,
    OFF_CROP = 32,
    OFF_TEXTREF = 64,
    OFF_PAYOFF = 80,
    OFF_PAYLEN = 84,
    OFF_PAYHASH = 88,
    OFF_TENSORS = 96,
    TENSOR_ENTRY = 32,
    OFF_RSV1 = 224,
    OFF_HDRHASH = 248,
    OFF_TENSOR4 = 256 /* version 2: the fifth entry, after the fixed 256 bytes */
};

static const uint8_t magic[4] = {'S', 'D', 'R', 'C'};

/* Little-endian stores and loads: the format is LE on every host. */
static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Doubles travel as their IEEE-754 bit pattern, little-endian. */
static void putf64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    put64(p, v);
}

/* The reverse of putf64: the crop box read back as the doubles it was. */
static double getf64(const uint8_t *p)
{
    uint64_t v = get64(p);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

/* The payload and each tensor in it start 16-byte aligned (docs/FORMATS.md): build
 * lays them out with this and parse checks the offsets against it. */
static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Header checksum: XXH3-64 of the fixed header up to the checksum field,
 * continued (as seed) over what follows it up to the payload (version 2's
 * fifth tensor entry, the name and its zero padding). */
static uint64_t header_hash(const uint8_t *v, size_t payload_off)
{
    uint64_t h = sd_hash64(v, OFF_HDRHASH, 0);
    return sd_hash64(v + SD_SHARD_HDR_SIZE, payload_off - SD_SHARD_HDR_SIZE, h);
}

/* A record version's header size: 256, or 288 for version 2 (a record
 * with a loss mask), whose fifth tensor entry follows the fixed 256 bytes. */
static size_t header_size(int version)
{
    return version >= 2 ? SD_SHARD_HDR_SIZE_V2 : SD_SHARD_HDR_SIZE;
}

/* Where tensor table entry i sits: 4 in the fixed header, a fifth after it. */
static size_t entry_offset(int i)
{
    return i < 4 ? (size_t)(OFF_TENSORS + TENSOR_ENTRY * i) : (size_t)OFF_TENSOR4;
}

/* The record version a record is written as: 2 only when it holds a mask,
 * so records without one stay readable by sdtk builds before masks. */
static int version_of(const sd_shard_rec *r)
{
    return (r->flags & SD_REC_F_MASK) ? 2 : 1;
}

/* Element count of a tensor's shape as parse validated it (ndim dims >= 1). */
static uint64_t elements(const sd_shard_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* Serialized size: header, name padded to 16, each tensor padded to 16
 * (the last one unpadded). 0 when the shape overflows. */
size_t sd_shard_rec_size(const sd_shard_rec *r)
{
    size_t n = align16(header_size(version_of(r)) + r->name_len);
    for (int i = 0; i < r->ntensors && i < SD_SHARD_MAX_TENSORS; i++) {
        uint64_t e = 1;
        for (int d = 0; d < r->t[i].ndim && d < 4; d++) {
            e *= r->t[i].shape[d];
            if (e > UINT32_MAX) return 0;
        }
        n = align16(n) + (size_t)(e * sd_dtype_size(r->t[i].dtype));
    }
    return n;
}

/* Lay out r into out and validate the result with the parser, so a builder
 * can never write a record that a reader rejects. */
sd_status sd_shard_rec_build(const sd_shard_rec *r, sd_buf *out, sd_error *err)
{
    sd_buf_clear(out);
    int version = version_of(r);
    int most = version >= 2 ? SD_SHARD_MAX_TENSORS : 4;
    if (r->ntensors < 1 || r->ntensors > most)
        return sd_err_set(err, SD_EINVAL, "record must hold 1..%d tensors, not %d", most, r->ntensors);
    if (r->name_len > SD_SHARD_MAX_KEY)
        return sd_err_set(err, SD_EINVAL, "record name is %zu bytes, more than %d", r->name_len, SD_SHARD_MAX_KEY);
    size_t total = sd_shard_rec_size(r);
    size_t hsize = header_size(version);
    size_t poff = align16(hsize + r->name_len);
    if (total == 0 || total - poff > UINT32_MAX)
        return sd_err_set(err, SD_ERANGE, "record payload too large (limit 4 GiB)");
    for (int i = 0; i < r->ntensors; i++)
        if (r->t[i].ndim < 1 || r->t[i].ndim > 4 || !sd_dtype_size(r->t[i].dtype))
            return sd_err_set(err, SD_EINVAL, "tensor %d: bad ndim %d or dtype %d", i, r->t[i].ndim, r->t[i].dtype);
    if (sd_buf_reserve(out, total)) return sd_err_set(err, SD_ENOMEM, "out of memory");
    uint8_t *v = (uint8_t *)out->data;
    memset(v, 0, total);
    memcpy(v + OFF_MAGIC, magic, 4);
    put16(v + OFF_VERSION, (uint16_t)version);
    put16(v + OFF_HDRSIZE, (uint16_t)hsize);
    v[OFF_KIND] = r->kind;
    v[OFF_NTENSORS] = (uint8_t)r->ntensors;
    put16(v + OFF_FLAGS, r->flags);
    put16(v + OFF_NAMELEN, (uint16_t)r->name_len);
    put32(v + OFF_ORIG, r->orig_w);
    put32(v + OFF_ORIG + 4, r->orig_h);
    put32(v + OFF_BUCKET, r->bucket_w);
    put32(v + OFF_BUCKET + 4, r->bucket_h);
    for (int i = 0; i < 4; i++) putf64(v + OFF_CROP + 8 * i, r->crop[i]);
    memcpy(v + OFF_TEXTREF, r->text_ref, 16);
    if (r->name_len) memcpy(v + hsize, r->name, r->name_len);
    size_t off = 0;
    for (int i = 0; i < r->ntensors; i++) {
        const sd_shard_tensor *t = &r->t[i];
        size_t len = (size_t)elements(t) * sd_dtype_size(t->dtype);
        off = align16(off);
        uint8_t *e = v + entry_offset(i);
        e[0] = t->dtype;
        e[1] = t->ndim;
        e[2] = t->role;
        for (int d = 0; d < t->ndim; d++) put32(e + 4 + 4 * d, t->shape[d]);
        put32(e + 20, (uint32_t)off);
        put32(e + 24, (uint32_t)len);
        if (len && t->data) memcpy(v + poff + off, t->data, len);
        off += len;
    }
    put32(v + OFF_PAYOFF, (uint32_t)poff);
    put32(v + OFF_PAYLEN, (uint32_t)off);
    put64(v + OFF_PAYHASH, sd_hash64(v + poff, off, 0));
    put64(v + OFF_HDRHASH, header_hash(v, poff));
    out->len = total;
    sd_shard_rec check;
    sd_status st = sd_shard_rec_parse(v, total, &check, err);
    if (st) sd_buf_clear(out);
    return st;
}

/* Which roles a record kind may hold. */
static int role_ok(int kind, int role)
{
    if (kind == SD_REC_LATENT) return role >= SD_ROLE_SAMPLE && role <= SD_ROLE_MASK;
    return role >= SD_ROLE_HIDDEN && role <= SD_ROLE_POOLED;
}

/* Reserved bytes, the name's padding and a text record's text_ref must be zero:
 * parse checks them with this. */
static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* One tensor table entry: dtype, dims, length = elements * size, aligned
 * offset inside the payload. Fills t. */
static sd_status parse_tensor(const uint8_t *e, int i, int kind, uint32_t paylen, sd_shard_tensor *t, sd_error *err)
{
    memset(t, 0, sizeof *t);
    t->dtype = e[0];
    t->ndim = e[1];
    t->role = e[2];
    if (!sd_dtype_size(t->dtype)) return sd_err_set(err, SD_EFORMAT, "tensor %d: unknown dtype %u", i, t->dtype);
    if (t->ndim < 1 || t->ndim > 4) return sd_err_set(err, SD_EFORMAT, "tensor %d: ndim %u not in 1..4", i, t->ndim);
    if (!role_ok(kind, t->role)) return sd_err_set(err, SD_EFORMAT, "tensor %d: role %u invalid for kind %d", i, t->role, kind);
    if (e[3] || get32(e + 28)) return sd_err_set(err, SD_EFORMAT, "tensor %d: reserved bytes not zero", i);
    for (int d = 0; d < 4; d++) {
        t->shape[d] = get32(e + 4 + 4 * d);
        if ((d < t->ndim) != (t->shape[d] != 0))
            return sd_err_set(err, SD_EFORMAT, "tensor %d: dim %d is %u (ndim %u)", i, d, t->shape[d], t->ndim);
    }
    t->offset = get32(e + 20);
    t->length = get32(e + 24);
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        n *= t->shape[d];
        if (n > UINT32_MAX) return sd_err_set(err, SD_EFORMAT, "tensor %d: shape too large", i);
    }
    if (n * sd_dtype_size(t->dtype) != t->length)
        return sd_err_set(err, SD_EFORMAT, "tensor %d: length %u does not match shape and dtype", i, t->length);
    if (t->offset % 16) return sd_err_set(err, SD_EFORMAT, "tensor %d: offset %u not 16-byte aligned", i, t->offset);
    if (t->offset > paylen || t->length > paylen - t->offset)
        return sd_err_set(err, SD_EFORMAT, "tensor %d: bytes %u+%u outside the %u-byte payload", i, t->offset, t->length, paylen);
    return SD_OK;
}

/* Tensors must not overlap, must not repeat a role, and the payload must
 * end where the last tensor ends. */
static sd_status check_tensor_set(const sd_shard_rec *r, sd_error *err)
{
    uint32_t end = 0;
    for (int i = 0; i < r->ntensors; i++) {
        const sd_shard_tensor *a = &r->t[i];
        if (a->offset + a->length > end) end = a->offset + a->length;
        for (int j = i + 1; j < r->ntensors; j++) {
            const sd_shard_tensor *b = &r->t[j];
            if (a->role == b->role) return sd_err_set(err, SD_EFORMAT, "tensors %d and %d have the same role %u", i, j, a->role);
            if (a->length && b->length && a->offset < b->offset + b->length && b->offset < a->offset + a->length)
                return sd_err_set(err, SD_EFORMAT, "tensors %d and %d overlap", i, j);
        }
    }
    if (end != r->payload_len)
        return sd_err_set(err, SD_EFORMAT, "payload is %u bytes but tensors end at %u", r->payload_len, end);
    return SD_OK;
}

/* A loss mask: fp32 [H, W] at the bucket's size (kohya's npz alpha_mask) or
 * at the latent size (bucket / 8); its values are checked by sd-verify. */
static sd_status check_mask(const sd_shard_rec *r, const sd_shard_tensor *t, sd_error *err)
{
    if (t->dtype != SD_DT_F32 || t->ndim != 2)
        return sd_err_set(err, SD_EFORMAT, "loss mask must be fp32 [height, width] (dtype %u, %u dimensions)",
                          t->dtype, t->ndim);
    int full = t->shape[0] == r->bucket_h && t->shape[1] == r->bucket_w;
    int latent = r->bucket_h % 8 == 0 && r->bucket_w % 8 == 0 && t->shape[0] == r->bucket_h / 8 &&
                 t->shape[1] == r->bucket_w / 8;
    if (!full && !latent)
        return sd_err_set(err, SD_EFORMAT, "loss mask is %ux%u, neither the bucket %ux%u nor its latent size",
                          t->shape[1], t->shape[0], r->bucket_w, r->bucket_h);
    return SD_OK;
}

/* Latent records: flags say which roles exist, and all latent tensors share
 * one shape and dtype (the mask has its own). */
static sd_status check_latent_roles(const sd_shard_rec *r, sd_error *err)
{
    int flip = (r->flags & SD_REC_F_FLIPPED) != 0, ms = (r->flags & SD_REC_F_MEANSTD) != 0;
    int want[8] = {0};
    if (ms) {
        want[SD_ROLE_MEAN] = want[SD_ROLE_STD] = 1;
        want[SD_ROLE_MEAN_FLIP] = want[SD_ROLE_STD_FLIP] = flip;
    } else {
        want[SD_ROLE_SAMPLE] = 1;
        want[SD_ROLE_SAMPLE_FLIP] = flip;
    }
    want[SD_ROLE_MASK] = (r->flags & SD_REC_F_MASK) != 0;
    int nwant = 0;
    for (int k = 1; k < 8; k++) nwant += want[k];
    if (nwant != r->ntensors)
        return sd_err_set(err, SD_EFORMAT, "latent flags 0x%x need %d tensors, record has %d", r->flags, nwant, r->ntensors);
    const sd_shard_tensor *first = NULL;
    for (int i = 0; i < r->ntensors; i++) {
        const sd_shard_tensor *t = &r->t[i];
        if (!want[t->role])
            return sd_err_set(err, SD_EFORMAT, "latent tensor %d: role %u not allowed by flags 0x%x", i, t->role, r->flags);
        if (t->role == SD_ROLE_MASK) {
            sd_status st = check_mask(r, t, err);
            if (st) return st;
            continue;
        }
        if (!first) first = t;
        else if (t->ndim != first->ndim || memcmp(t->shape, first->shape, sizeof first->shape) || t->dtype != first->dtype)
            return sd_err_set(err, SD_EFORMAT, "latent tensor %d: shape or dtype differs from the first latent", i);
    }
    return SD_OK;
}

/* A record claiming a newer format whose header checksum holds once its
 * version field reads a version this code reads: a damaged record (a bit
 * flip), not a newer one, so it is corrupt rather than kept as unreadable.
 * Only the header and name are hashed (on a stack copy of the fixed header). */
static int version_field_damaged(const uint8_t *v, size_t len)
{
    uint32_t off = get32(v + OFF_PAYOFF);
    if (off < SD_SHARD_HDR_SIZE || off > len) return 0;
    uint8_t hdr[OFF_HDRHASH];
    memcpy(hdr, v, sizeof hdr);
    for (int version = 1; version <= SD_REC_VERSION_MAX; version++) {
        put16(hdr + OFF_VERSION, (uint16_t)version);
        uint64_t h = sd_hash64(hdr, sizeof hdr, 0);
        if (sd_hash64(v + SD_SHARD_HDR_SIZE, off - SD_SHARD_HDR_SIZE, h) == get64(v + OFF_HDRHASH)) return 1;
    }
    return 0;
}

/* Validate every byte of the header and describe the record. */
sd_status sd_shard_rec_parse(const void *val, size_t len, sd_shard_rec *out, sd_error *err)
{
    const uint8_t *v = val;
    memset(out, 0, sizeof *out);
    if (len < SD_SHARD_HDR_SIZE)
        return sd_err_set(err, SD_ETRUNC, "record is %zu bytes, shorter than the %d-byte header", len, SD_SHARD_HDR_SIZE);
    if (memcmp(v, magic, 4)) return sd_err_set(err, SD_EFORMAT, "bad record magic");
    uint16_t version = get16(v + OFF_VERSION);
    if (version > SD_REC_VERSION_MAX && version_field_damaged(v, len))
        return sd_err_set(err, SD_EFORMAT, "record format version %u is newer than this sdtk reads (%d), but its "
                          "header checksum holds for a version it reads: the version field is damaged", version,
                          SD_REC_VERSION_MAX);
    if (version > SD_REC_VERSION_MAX)
        return sd_err_set(err, SD_EUNSUPPORTED, "record format version %u is newer than this sdtk reads (%d)", version,
                          SD_REC_VERSION_MAX);
    if (version < 1) return sd_err_set(err, SD_EFORMAT, "bad record format version %u", version);
    size_t hsize = header_size(version);
    if (len < hsize)
        return sd_err_set(err, SD_ETRUNC, "record is %zu bytes, shorter than its %zu-byte header", len, hsize);
    if (get16(v + OFF_HDRSIZE) != hsize)
        return sd_err_set(err, SD_EFORMAT, "header size %u, expected %zu for record version %u", get16(v + OFF_HDRSIZE),
                          hsize, version);
    out->kind = v[OFF_KIND];
    out->ntensors = v[OFF_NTENSORS];
    out->flags = get16(v + OFF_FLAGS);
    out->name_len = get16(v + OFF_NAMELEN);
    if (out->kind != SD_REC_LATENT && out->kind != SD_REC_TEXT)
        return sd_err_set(err, SD_EFORMAT, "unknown record kind %u", out->kind);
    int most = version >= 2 ? SD_SHARD_MAX_TENSORS : 4;
    if (out->ntensors < 1 || out->ntensors > most)
        return sd_err_set(err, SD_EFORMAT, "tensor count %d not in 1..%d", out->ntensors, most);
    if (out->flags & ~SD_REC_F_ALL) return sd_err_set(err, SD_EFORMAT, "unknown flags 0x%x", out->flags);
    if (((out->flags & SD_REC_F_MASK) != 0) != (version >= 2))
        return sd_err_set(err, SD_EFORMAT, "record version %u with flags 0x%x: a loss mask (flag 16) is version 2's "
                          "and only its", version, out->flags);
    if (out->kind == SD_REC_TEXT &&
        (out->flags & (SD_REC_F_FLIPPED | SD_REC_F_MEANSTD | SD_REC_F_TRANSPOSED | SD_REC_F_MASK)))
        return sd_err_set(err, SD_EFORMAT, "text record with latent flags 0x%x", out->flags);
    if (out->name_len > SD_SHARD_MAX_KEY) return sd_err_set(err, SD_EFORMAT, "name length %zu > %d", out->name_len, SD_SHARD_MAX_KEY);
    if (get16(v + OFF_RSV0) || !all_zero(v + OFF_RSV1, OFF_HDRHASH - OFF_RSV1))
        return sd_err_set(err, SD_EFORMAT, "reserved header bytes not zero");
    out->payload_off = get32(v + OFF_PAYOFF);
    out->payload_len = get32(v + OFF_PAYLEN);
    if (out->payload_off != align16(hsize + out->name_len))
        return sd_err_set(err, SD_EFORMAT, "payload offset %u does not follow the %zu-byte name", out->payload_off, out->name_len);
    if (len < out->payload_off || len - out->payload_off != out->payload_len)
        return sd_err_set(err, len < (size_t)out->payload_off + out->payload_len ? SD_ETRUNC : SD_EFORMAT,
                          "record is %zu bytes, header says %u + %u", len, out->payload_off, out->payload_len);
    if (header_hash(v, out->payload_off) != get64(v + OFF_HDRHASH))
        return sd_err_set(err, SD_EFORMAT, "header checksum mismatch");
    if (!all_zero(v + hsize + out->name_len, out->payload_off - hsize - out->name_len))
        return sd_err_set(err, SD_EFORMAT, "name padding not zero");
    out->orig_w = get32(v + OFF_ORIG);
    out->orig_h = get32(v + OFF_ORIG + 4);
    out->bucket_w = get32(v + OFF_BUCKET);
    out->bucket_h = get32(v + OFF_BUCKET + 4);
    for (int i = 0; i < 4; i++) {
        out->crop[i] = getf64(v + OFF_CROP + 8 * i);
        if (!isfinite(out->crop[i])) return sd_err_set(err, SD_EFORMAT, "crop box value %d not finite", i);
    }
    memcpy(out->text_ref, v + OFF_TEXTREF, 16);
    if (out->kind == SD_REC_TEXT && !all_zero(out->text_ref, 16))
        return sd_err_set(err, SD_EFORMAT, "text record with a text reference");
    out->name = (const char *)v + hsize;
    out->payload = v + out->payload_off;
    out->payload_hash = get64(v + OFF_PAYHASH);
    for (int i = 0; i < most; i++) {
        const uint8_t *e = v + entry_offset(i);
        if (i >= out->ntensors) {
            if (!all_zero(e, TENSOR_ENTRY)) return sd_err_set(err, SD_EFORMAT, "unused tensor entry %d not zero", i);
            continue;
        }
        sd_status st = parse_tensor(e, i, out->kind, out->payload_len, &out->t[i], err);
        if (st) return st;
        out->t[i].data = (const uint8_t *)out->payload + out->t[i].offset;
    }
    sd_status st = check_tensor_set(out, err);
    if (!st && out->kind == SD_REC_LATENT) st = check_latent_roles(out, err);
    return st;
}

/* The expensive half of verification: hash the payload bytes. */
sd_status sd_shard_rec_check_payload(const sd_shard_rec *r, sd_error *err)
{
    if (sd_hash64(r->payload, r->payload_len, 0) != r->payload_hash)
        return sd_err_set(err, SD_EFORMAT, "payload checksum mismatch");
    return SD_OK;
}

/* Lookup by role for readers that want "the sample" or "pooled". */
const sd_shard_tensor *sd_shard_rec_tensor(const sd_shard_rec *r, int role)
{
    for (int i = 0; i < r->ntensors && i < SD_SHARD_MAX_TENSORS; i++)
        if (r->t[i].role == role) return &r->t[i];
    return NULL;
}

/* Bucket keys sort by width, then height. */
void sd_shard_bucket_key(uint32_t w, uint32_t h, uint8_t out[8])
{
    for (int i = 0; i < 4; i++) {
        out[i] = (uint8_t)(w >> (24 - 8 * i));
        out[4 + i] = (uint8_t)(h >> (24 - 8 * i));
    }
}

/* The reverse of sd_shard_bucket_key, for readers of the buckets database. */
void sd_shard_bucket_unkey(const uint8_t in[8], uint32_t *w, uint32_t *h)
{
    *w = (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | in[3];
    *h = (uint32_t)in[4] << 24 | (uint32_t)in[5] << 16 | (uint32_t)in[6] << 8 | in[7];
}

/* A text key as the empty_text meta writes it. */
void sd_shard_text_key_hex(const uint8_t key[16], char out[33])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[key[i] >> 4];
        out[2 * i + 1] = digits[key[i] & 15];
    }
    out[32] = 0;
}

/* The value of one hex digit, -1 for any other character. */
static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The empty_text meta back into a key: exactly 32 hex digits. */
int sd_shard_text_key_parse(const char *s, uint8_t key[16])
{
    if (strlen(s) != 32) return 0;
    for (int i = 0; i < 16; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}
