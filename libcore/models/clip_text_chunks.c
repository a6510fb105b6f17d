/* Prompts over 75 tokens as kohya-ss/sd-scripts encodes them
 * (--max_token_length 150/225): the ids are cut into 77-long chunks by
 * sd_clip_kohya_chunks (clip_tok.c), each chunk goes through the encoder
 * alone, and the chunks' hidden states are joined back into one sequence
 * of 75 k + 2 rows here. */
#include <string.h>

#include "clip_text.h"

/* The rows of a caption's joined hidden state for --max-tokens N: N + 2
 * (77, 152, 227), 0 for a length sd-scripts does not offer. */
int sd_clip_kohya_rows(int max_tokens)
{
    return max_tokens == 75 || max_tokens == 150 || max_tokens == 225 ? max_tokens + 2 : 0;
}

/* sd-scripts' get_hidden_states / get_hidden_states_sdxl join of k chunks
 * ([k, 77, width], the order sd_clip_kohya_chunks made them) into out
 * [75 k + 2, width]: the first chunk's BOS row, rows 1..75 of every chunk
 * in turn, and the last chunk's row 76 (its EOS or pad). Every chunk's own
 * BOS and last row but those two are dropped. sd-scripts treats SD 2.x and
 * SDXL's second encoder the same way: its fix-up for a chunk that starts
 * with EOS compares a tensor with the EOS token's string (never equal) in
 * get_hidden_states and is commented out in get_hidden_states_sdxl, so no
 * row is copied over another. k = 1 is a plain copy. */
void sd_clip_kohya_join(const float *chunks, size_t k, size_t width, float *out)
{
    size_t row = width * sizeof(float), body = 75 * row;
    memcpy(out, chunks, row);
    for (size_t c = 0; c < k; c++)
        memcpy(out + (1 + 75 * c) * width, chunks + (c * 77 + 1) * width, body);
    memcpy(out + (75 * k + 1) * width, chunks + (k * 77 - 1) * width, row);
}
