/* Caption text cleanup in front of the CLIP tokenizer, as transformers'
 * CLIPTokenizer does it with ftfy installed: decode (invalid UTF-8 becomes
 * U+FFFD), ftfy.fix_text (minus its mojibake repair), whitespace collapse,
 * Python str.lower(). Works on arrays of code points. */
#ifndef SDTK_CLIP_CLEAN_H
#define SDTK_CLIP_CLEAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t *v;
    size_t n, cap;
} sd_u32vec;

int sd_u32vec_push(sd_u32vec *a, uint32_t c);
void sd_u32vec_free(sd_u32vec *a);
size_t sd_clip_decode_utf8(const char *s, size_t n, sd_u32vec *out, int *oom);
int sd_clip_fix_text(const uint32_t *in, size_t n, sd_u32vec *out, sd_u32vec *tmp, sd_u32vec *tmp2);
int sd_clip_ws_lower(const uint32_t *in, size_t n, sd_u32vec *out);
int sd_clip_is_space(uint32_t c);
const char *sd_clip_html_entity(const char *s, size_t n);

#endif
