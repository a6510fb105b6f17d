/* NumPy .npz archives (a zip of .npy members, stored as np.savez writes them
 * or deflated as np.savez_compressed does): a reader that validates every
 * member and a writer of uncompressed archives np.load reads. */
#ifndef SDTK_NPZ_H
#define SDTK_NPZ_H

#include <stddef.h>

#include "buf.h"
#include "err.h"
#include "npy.h"

enum { SD_NPZ_MAX_MEMBERS = 64 };
#define SD_NPZ_MAX_BYTES ((size_t)256 << 20) /* all members together, uncompressed */

typedef struct {
    char *key;         /* member name without ".npy" */
    sd_npy_info info;
    unsigned char *raw; /* the whole .npy member */
    const void *data;  /* its array data (inside raw) */
} sd_npz_member;

typedef struct {
    sd_npz_member *m;
    size_t n;
} sd_npz;

sd_status sd_npz_read_mem(sd_npz *z, const void *data, size_t len, sd_error *err);
sd_status sd_npz_read_file(sd_npz *z, const char *path, sd_error *err);
const sd_npz_member *sd_npz_find(const sd_npz *z, const char *key);
void sd_npz_free(sd_npz *z);

typedef struct {
    struct archive *a;
    sd_buf out; /* the archive bytes once finished */
    sd_buf npy; /* scratch for one member */
    int failed;
} sd_npz_writer;

sd_status sd_npz_writer_init(sd_npz_writer *w, sd_error *err);
sd_status sd_npz_writer_add(sd_npz_writer *w, const char *key, sd_npy_dtype t, int ndim, const uint64_t *shape,
                            const void *data, sd_error *err);
sd_status sd_npz_writer_finish(sd_npz_writer *w, sd_error *err);
void sd_npz_writer_free(sd_npz_writer *w);

#endif
