/* Fuzz target for the shard record parser: any bytes go through
 * sd_shard_rec_parse; an accepted record must have every tensor inside the
 * value (touched byte by byte, so ASan sees any escape), must pass or fail
 * the payload check cleanly, and must rebuild into a record that parses. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "hash.h"
#include "shard.h"

/* Inputs whose first byte is even get a correct header checksum (bytes
 * 248..255) before parsing, so the fuzzer also reaches the checks behind
 * it; the byte itself is dropped. */
static size_t fix_checksum(uint8_t *v, size_t size)
{
    if (size < 256) return size;
    size_t poff = (size_t)v[80] | (size_t)v[81] << 8;
    if (poff < 256 || poff > size || v[82] || v[83]) return size;
    uint64_t h = sd_hash64(v, 248, 0);
    h = sd_hash64(v + 256, poff - 256, h);
    for (int i = 0; i < 8; i++) v[248 + i] = (uint8_t)(h >> (8 * i));
    return size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy: the parser must not read past size */
    uint8_t *v = malloc(size ? size : 1);
    if (!v) abort();
    if (size && !(data[0] & 1)) {
        size--;
        memcpy(v, data + 1, size);
        size = fix_checksum(v, size);
    } else if (size) {
        memcpy(v, data, size);
    }
    sd_shard_rec r;
    sd_error err;
    if (sd_shard_rec_parse(v, size, &r, &err) == SD_OK) {
        unsigned sum = 0;
        for (int i = 0; i < r.ntensors; i++) {
            const uint8_t *p = r.t[i].data;
            if (p < v || p + r.t[i].length > v + size) abort();
            for (uint32_t j = 0; j < r.t[i].length; j++) sum += p[j];
        }
        if ((const uint8_t *)r.name + r.name_len > v + size) abort();
        (void)sd_shard_rec_check_payload(&r, &err);
        sd_buf b;
        sd_buf_init(&b);
        if (sd_shard_rec_build(&r, &b, &err) != SD_OK) abort();
        sd_shard_rec again;
        if (sd_shard_rec_parse(b.data, b.len, &again, &err) != SD_OK || again.ntensors != r.ntensors ||
            again.name_len != r.name_len || (sum == 0xdeadbeef && b.len == 0))
            abort();
        sd_buf_free(&b);
    }
    free(v);
    return 0;
}
