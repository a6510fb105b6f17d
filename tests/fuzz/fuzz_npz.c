/* Fuzz target for the .npy header parser, the .npz reader and the kohya
 * cache checks: the input is parsed as a bare .npy (and, when valid,
 * written back and parsed again to the same array), then as an npz whose
 * members go through the latents and te_outputs validators. Because
 * libarchive is not instrumented, the input is also cut into .npy members
 * with kohya key names and wrapped in a valid zip, so the fuzzer reaches
 * the cache validators with well-formed archives. */
#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "fuzz.h"
#include "kohya_cache.h"
#include "npy.h"
#include "npz.h"

/* A valid .npy must survive write -> parse unchanged. */
static void npy_round_trip(const uint8_t *data, size_t size)
{
    sd_npy_info in, again;
    const void *payload, *p2;
    sd_error err;
    if (sd_npy_parse(data, size, &in, &payload, &err) != SD_OK) return;
    sd_buf b;
    sd_buf_init(&b);
    if (sd_npy_write(&b, in.dtype, in.ndim, in.shape, payload, &err) != SD_OK) abort();
    if (sd_npy_parse(b.data, b.len, &again, &p2, &err) != SD_OK) abort();
    if (again.dtype != in.dtype || again.ndim != in.ndim || again.nbytes != in.nbytes ||
        memcmp(again.shape, in.shape, sizeof in.shape) != 0 || (in.nbytes && memcmp(p2, payload, in.nbytes) != 0))
        abort();
    sd_buf_free(&b);
}

/* Read the bytes as an npz and validate the members as both cache kinds. */
static void npz_check(const uint8_t *data, size_t size)
{
    sd_npz z;
    sd_error err;
    if (sd_npz_read_mem(&z, data, size, &err) != SD_OK) {
        if (z.n || z.m) abort(); /* a failed read leaves nothing behind */
        return;
    }
    const char *reason = NULL;
    sd_kohya_latents l;
    memset(&l, 0, sizeof l);
    l.z = z;
    if (sd_kohya_latents_check(&l, &reason, &err) != SD_OK && !reason) abort();
    sd_kohya_te t;
    memset(&t, 0, sizeof t);
    t.z = z;
    reason = NULL;
    if (sd_kohya_te_check(&t, &reason, &err) != SD_OK && !reason) abort();
    sd_npz_free(&z);
}

/* libarchive output callback: append to a buffer. */
static la_ssize_t append(struct archive *a, void *ctx, const void *buf, size_t n)
{
    (void)a;
    sd_buf_put(ctx, buf, n);
    return (la_ssize_t)n;
}

/* Input layout: byte 0 = member count (1..5) and byte 1 = key set; the
 * rest is split at "\n--\n" separators into raw .npy member bodies. */
static void wrapped(const uint8_t *data, size_t size)
{
    static const char *keys[2][5] = {{"latents", "original_size", "crop_ltrb", "latents_flipped", "alpha_mask"},
                                     {"hidden_state1", "hidden_state2", "pool2", "latents_16x16", "x"}};
    if (size < 2) return;
    int n = data[0] % 5 + 1;
    const char *const *names = keys[data[1] & 1];
    sd_buf zip;
    sd_buf_init(&zip);
    struct archive *a = archive_write_new();
    archive_write_set_format_zip(a);
    if (data[1] & 2) archive_write_zip_set_compression_store(a);
    archive_write_set_bytes_in_last_block(a, 1);
    archive_write_open(a, &zip, NULL, append, NULL);
    const uint8_t *p = data + 2, *end = data + size;
    for (int i = 0; i < n && p <= end; i++) {
        const uint8_t *q = p;
        while (q + 4 <= end && memcmp(q, "\n--\n", 4) != 0) q++;
        if (q + 4 > end) q = end;
        char name[64];
        snprintf(name, sizeof name, "%s.npy", names[i]);
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, (la_int64_t)(q - p));
        archive_write_header(a, e);
        archive_write_data(a, p, (size_t)(q - p));
        archive_entry_free(e);
        p = q + 4;
    }
    archive_write_close(a);
    archive_write_free(a);
    npz_check((const uint8_t *)(zip.data ? zip.data : ""), zip.len);
    sd_buf_free(&zip);
}

/* libFuzzer entry. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npy_round_trip(data, size);
    npz_check(data, size);
    wrapped(data, size);
    return 0;
}
