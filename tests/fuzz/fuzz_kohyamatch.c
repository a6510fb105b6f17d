/* Fuzz target for the kohya key matcher (formats/kohya_meta.c), which
 * sd-pack import-kohya --meta and sd-latents --text-only run on names and
 * keys from users' files: paths with '/', '\', dots, empty components and
 * image extensions. The input is lines: keys, a line "--", then names.
 * Every name is looked up; a match must be one of the keys, at a depth of
 * at least 1 unless it is the name itself, and a name equal to a key must
 * find that key's last entry. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kohya_cache.h"

enum { MAX_LINES = 256 };

/* Split a copy of the input at newlines into NUL-terminated lines. */
static size_t split_lines(char *text, size_t len, char **lines)
{
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= len && n < MAX_LINES; i++) {
        if (i == len || text[i] == '\n') {
            text[i] = 0;
            lines[n++] = text + start;
            start = i + 1;
        }
    }
    return n;
}

/* One input: index the keys, look up every name, check the invariants. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    char *lines[MAX_LINES];
    size_t n = split_lines(text, size, lines), nkeys = 0;
    while (nkeys < n && strcmp(lines[nkeys], "--") != 0) nkeys++;
    sd_kohya_meta m;
    sd_error err;
    if (sd_kohya_meta_index_keys(&m, (const char *const *)lines, nkeys, &err) == SD_OK) {
        for (size_t i = nkeys + 1; i < n; i++) {
            sd_kohya_meta_match mm;
            sd_kohya_meta_find(&m, lines[i], &mm);
            if (mm.entry && (mm.entry < m.e || mm.entry >= m.e + m.n)) abort();
            /* depth 0 only for an exact match of a name with no component ("", ".", "/") */
            if (mm.entry && mm.depth < 1 && strcmp(mm.entry->key, lines[i]) != 0) abort();
            if (mm.ambiguous && (mm.entry || !mm.cand[0] || !mm.cand[1])) abort();
            size_t last = nkeys;
            for (size_t k = 0; k < nkeys; k++)
                if (strcmp(lines[k], lines[i]) == 0) last = k;
            if (last < nkeys && mm.entry != &m.e[last]) abort();
        }
    }
    sd_kohya_meta_free(&m);
    free(text);
    return 0;
}
